from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TYPE_INVALID: _ClassVar[DataType]
    TYPE_BOOL: _ClassVar[DataType]
    TYPE_UINT8: _ClassVar[DataType]
    TYPE_UINT16: _ClassVar[DataType]
    TYPE_UINT32: _ClassVar[DataType]
    TYPE_UINT64: _ClassVar[DataType]
    TYPE_INT8: _ClassVar[DataType]
    TYPE_INT16: _ClassVar[DataType]
    TYPE_INT32: _ClassVar[DataType]
    TYPE_INT64: _ClassVar[DataType]
    TYPE_FP16: _ClassVar[DataType]
    TYPE_FP32: _ClassVar[DataType]
    TYPE_FP64: _ClassVar[DataType]
    TYPE_STRING: _ClassVar[DataType]
    TYPE_BF16: _ClassVar[DataType]
TYPE_INVALID: DataType
TYPE_BOOL: DataType
TYPE_UINT8: DataType
TYPE_UINT16: DataType
TYPE_UINT32: DataType
TYPE_UINT64: DataType
TYPE_INT8: DataType
TYPE_INT16: DataType
TYPE_INT32: DataType
TYPE_INT64: DataType
TYPE_FP16: DataType
TYPE_FP32: DataType
TYPE_FP64: DataType
TYPE_STRING: DataType
TYPE_BF16: DataType

class ServerLiveRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerLiveResponse(_message.Message):
    __slots__ = ("live",)
    LIVE_FIELD_NUMBER: _ClassVar[int]
    live: bool
    def __init__(self, live: _Optional[bool] = ...) -> None: ...

class ServerReadyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerReadyResponse(_message.Message):
    __slots__ = ("ready",)
    READY_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    def __init__(self, ready: _Optional[bool] = ...) -> None: ...

class ModelReadyRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ModelReadyResponse(_message.Message):
    __slots__ = ("ready",)
    READY_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    def __init__(self, ready: _Optional[bool] = ...) -> None: ...

class ServerMetadataRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerMetadataResponse(_message.Message):
    __slots__ = ("name", "version", "extensions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    extensions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., extensions: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelMetadataRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ModelMetadataResponse(_message.Message):
    __slots__ = ("name", "versions", "platform", "inputs", "outputs")
    class TensorMetadata(_message.Message):
        __slots__ = ("name", "datatype", "shape")
        NAME_FIELD_NUMBER: _ClassVar[int]
        DATATYPE_FIELD_NUMBER: _ClassVar[int]
        SHAPE_FIELD_NUMBER: _ClassVar[int]
        name: str
        datatype: str
        shape: _containers.RepeatedScalarFieldContainer[int]
        def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    versions: _containers.RepeatedScalarFieldContainer[str]
    platform: str
    inputs: _containers.RepeatedCompositeFieldContainer[ModelMetadataResponse.TensorMetadata]
    outputs: _containers.RepeatedCompositeFieldContainer[ModelMetadataResponse.TensorMetadata]
    def __init__(self, name: _Optional[str] = ..., versions: _Optional[_Iterable[str]] = ..., platform: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[ModelMetadataResponse.TensorMetadata, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[ModelMetadataResponse.TensorMetadata, _Mapping]]] = ...) -> None: ...

class InferParameter(_message.Message):
    __slots__ = ("bool_param", "int64_param", "string_param", "double_param", "uint64_param")
    BOOL_PARAM_FIELD_NUMBER: _ClassVar[int]
    INT64_PARAM_FIELD_NUMBER: _ClassVar[int]
    STRING_PARAM_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_PARAM_FIELD_NUMBER: _ClassVar[int]
    UINT64_PARAM_FIELD_NUMBER: _ClassVar[int]
    bool_param: bool
    int64_param: int
    string_param: str
    double_param: float
    uint64_param: int
    def __init__(self, bool_param: _Optional[bool] = ..., int64_param: _Optional[int] = ..., string_param: _Optional[str] = ..., double_param: _Optional[float] = ..., uint64_param: _Optional[int] = ...) -> None: ...

class InferTensorContents(_message.Message):
    __slots__ = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp32_contents", "fp64_contents", "bytes_contents")
    BOOL_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    INT_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    INT64_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    UINT_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    UINT64_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    FP32_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    FP64_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    bool_contents: _containers.RepeatedScalarFieldContainer[bool]
    int_contents: _containers.RepeatedScalarFieldContainer[int]
    int64_contents: _containers.RepeatedScalarFieldContainer[int]
    uint_contents: _containers.RepeatedScalarFieldContainer[int]
    uint64_contents: _containers.RepeatedScalarFieldContainer[int]
    fp32_contents: _containers.RepeatedScalarFieldContainer[float]
    fp64_contents: _containers.RepeatedScalarFieldContainer[float]
    bytes_contents: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, bool_contents: _Optional[_Iterable[bool]] = ..., int_contents: _Optional[_Iterable[int]] = ..., int64_contents: _Optional[_Iterable[int]] = ..., uint_contents: _Optional[_Iterable[int]] = ..., uint64_contents: _Optional[_Iterable[int]] = ..., fp32_contents: _Optional[_Iterable[float]] = ..., fp64_contents: _Optional[_Iterable[float]] = ..., bytes_contents: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ModelInferRequest(_message.Message):
    __slots__ = ("model_name", "model_version", "id", "parameters", "inputs", "outputs", "raw_input_contents")
    class InferInputTensor(_message.Message):
        __slots__ = ("name", "datatype", "shape", "parameters", "contents")
        class ParametersEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: InferParameter
            def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[InferParameter, _Mapping]] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        DATATYPE_FIELD_NUMBER: _ClassVar[int]
        SHAPE_FIELD_NUMBER: _ClassVar[int]
        PARAMETERS_FIELD_NUMBER: _ClassVar[int]
        CONTENTS_FIELD_NUMBER: _ClassVar[int]
        name: str
        datatype: str
        shape: _containers.RepeatedScalarFieldContainer[int]
        parameters: _containers.MessageMap[str, InferParameter]
        contents: InferTensorContents
        def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., parameters: _Optional[_Mapping[str, InferParameter]] = ..., contents: _Optional[_Union[InferTensorContents, _Mapping]] = ...) -> None: ...
    class InferRequestedOutputTensor(_message.Message):
        __slots__ = ("name", "parameters")
        class ParametersEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: InferParameter
            def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[InferParameter, _Mapping]] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        PARAMETERS_FIELD_NUMBER: _ClassVar[int]
        name: str
        parameters: _containers.MessageMap[str, InferParameter]
        def __init__(self, name: _Optional[str] = ..., parameters: _Optional[_Mapping[str, InferParameter]] = ...) -> None: ...
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: InferParameter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[InferParameter, _Mapping]] = ...) -> None: ...
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    RAW_INPUT_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_version: str
    id: str
    parameters: _containers.MessageMap[str, InferParameter]
    inputs: _containers.RepeatedCompositeFieldContainer[ModelInferRequest.InferInputTensor]
    outputs: _containers.RepeatedCompositeFieldContainer[ModelInferRequest.InferRequestedOutputTensor]
    raw_input_contents: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., id: _Optional[str] = ..., parameters: _Optional[_Mapping[str, InferParameter]] = ..., inputs: _Optional[_Iterable[_Union[ModelInferRequest.InferInputTensor, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[ModelInferRequest.InferRequestedOutputTensor, _Mapping]]] = ..., raw_input_contents: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ModelInferResponse(_message.Message):
    __slots__ = ("model_name", "model_version", "id", "parameters", "outputs", "raw_output_contents")
    class InferOutputTensor(_message.Message):
        __slots__ = ("name", "datatype", "shape", "parameters", "contents")
        class ParametersEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: InferParameter
            def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[InferParameter, _Mapping]] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        DATATYPE_FIELD_NUMBER: _ClassVar[int]
        SHAPE_FIELD_NUMBER: _ClassVar[int]
        PARAMETERS_FIELD_NUMBER: _ClassVar[int]
        CONTENTS_FIELD_NUMBER: _ClassVar[int]
        name: str
        datatype: str
        shape: _containers.RepeatedScalarFieldContainer[int]
        parameters: _containers.MessageMap[str, InferParameter]
        contents: InferTensorContents
        def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., parameters: _Optional[_Mapping[str, InferParameter]] = ..., contents: _Optional[_Union[InferTensorContents, _Mapping]] = ...) -> None: ...
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: InferParameter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[InferParameter, _Mapping]] = ...) -> None: ...
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    RAW_OUTPUT_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_version: str
    id: str
    parameters: _containers.MessageMap[str, InferParameter]
    outputs: _containers.RepeatedCompositeFieldContainer[ModelInferResponse.InferOutputTensor]
    raw_output_contents: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., id: _Optional[str] = ..., parameters: _Optional[_Mapping[str, InferParameter]] = ..., outputs: _Optional[_Iterable[_Union[ModelInferResponse.InferOutputTensor, _Mapping]]] = ..., raw_output_contents: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ModelStreamInferResponse(_message.Message):
    __slots__ = ("error_message", "infer_response")
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    INFER_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    error_message: str
    infer_response: ModelInferResponse
    def __init__(self, error_message: _Optional[str] = ..., infer_response: _Optional[_Union[ModelInferResponse, _Mapping]] = ...) -> None: ...

class ModelInstanceGroup(_message.Message):
    __slots__ = ("name", "count", "kind")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_AUTO: _ClassVar[ModelInstanceGroup.Kind]
        KIND_GPU: _ClassVar[ModelInstanceGroup.Kind]
        KIND_CPU: _ClassVar[ModelInstanceGroup.Kind]
        KIND_MODEL: _ClassVar[ModelInstanceGroup.Kind]
    KIND_AUTO: ModelInstanceGroup.Kind
    KIND_GPU: ModelInstanceGroup.Kind
    KIND_CPU: ModelInstanceGroup.Kind
    KIND_MODEL: ModelInstanceGroup.Kind
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    kind: ModelInstanceGroup.Kind
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., kind: _Optional[_Union[ModelInstanceGroup.Kind, str]] = ...) -> None: ...

class ModelTensorReshape(_message.Message):
    __slots__ = ("shape",)
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelInput(_message.Message):
    __slots__ = ("name", "data_type", "dims", "reshape", "optional")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    RESHAPE_FIELD_NUMBER: _ClassVar[int]
    OPTIONAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_type: DataType
    dims: _containers.RepeatedScalarFieldContainer[int]
    reshape: ModelTensorReshape
    optional: bool
    def __init__(self, name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ..., reshape: _Optional[_Union[ModelTensorReshape, _Mapping]] = ..., optional: _Optional[bool] = ...) -> None: ...

class ModelOutput(_message.Message):
    __slots__ = ("name", "data_type", "dims", "reshape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    RESHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_type: DataType
    dims: _containers.RepeatedScalarFieldContainer[int]
    reshape: ModelTensorReshape
    def __init__(self, name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ..., reshape: _Optional[_Union[ModelTensorReshape, _Mapping]] = ...) -> None: ...

class ModelVersionPolicy(_message.Message):
    __slots__ = ("latest", "all", "specific")
    class Latest(_message.Message):
        __slots__ = ("num_versions",)
        NUM_VERSIONS_FIELD_NUMBER: _ClassVar[int]
        num_versions: int
        def __init__(self, num_versions: _Optional[int] = ...) -> None: ...
    class All(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Specific(_message.Message):
        __slots__ = ("versions",)
        VERSIONS_FIELD_NUMBER: _ClassVar[int]
        versions: _containers.RepeatedScalarFieldContainer[int]
        def __init__(self, versions: _Optional[_Iterable[int]] = ...) -> None: ...
    LATEST_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    SPECIFIC_FIELD_NUMBER: _ClassVar[int]
    latest: ModelVersionPolicy.Latest
    all: ModelVersionPolicy.All
    specific: ModelVersionPolicy.Specific
    def __init__(self, latest: _Optional[_Union[ModelVersionPolicy.Latest, _Mapping]] = ..., all: _Optional[_Union[ModelVersionPolicy.All, _Mapping]] = ..., specific: _Optional[_Union[ModelVersionPolicy.Specific, _Mapping]] = ...) -> None: ...

class ModelQueuePolicy(_message.Message):
    __slots__ = ("timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size")
    class TimeoutAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REJECT: _ClassVar[ModelQueuePolicy.TimeoutAction]
        DELAY: _ClassVar[ModelQueuePolicy.TimeoutAction]
    REJECT: ModelQueuePolicy.TimeoutAction
    DELAY: ModelQueuePolicy.TimeoutAction
    TIMEOUT_ACTION_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TIMEOUT_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_TIMEOUT_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    timeout_action: ModelQueuePolicy.TimeoutAction
    default_timeout_microseconds: int
    allow_timeout_override: bool
    max_queue_size: int
    def __init__(self, timeout_action: _Optional[_Union[ModelQueuePolicy.TimeoutAction, str]] = ..., default_timeout_microseconds: _Optional[int] = ..., allow_timeout_override: _Optional[bool] = ..., max_queue_size: _Optional[int] = ...) -> None: ...

class ModelDynamicBatching(_message.Message):
    __slots__ = ("preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering", "priority_levels", "default_priority_level", "default_queue_policy", "priority_queue_policy")
    class PriorityQueuePolicyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: ModelQueuePolicy
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[ModelQueuePolicy, _Mapping]] = ...) -> None: ...
    PREFERRED_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    PRESERVE_ORDERING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PRIORITY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_QUEUE_POLICY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_QUEUE_POLICY_FIELD_NUMBER: _ClassVar[int]
    preferred_batch_size: _containers.RepeatedScalarFieldContainer[int]
    max_queue_delay_microseconds: int
    preserve_ordering: bool
    priority_levels: int
    default_priority_level: int
    default_queue_policy: ModelQueuePolicy
    priority_queue_policy: _containers.MessageMap[int, ModelQueuePolicy]
    def __init__(self, preferred_batch_size: _Optional[_Iterable[int]] = ..., max_queue_delay_microseconds: _Optional[int] = ..., preserve_ordering: _Optional[bool] = ..., priority_levels: _Optional[int] = ..., default_priority_level: _Optional[int] = ..., default_queue_policy: _Optional[_Union[ModelQueuePolicy, _Mapping]] = ..., priority_queue_policy: _Optional[_Mapping[int, ModelQueuePolicy]] = ...) -> None: ...

class ModelSequenceBatching(_message.Message):
    __slots__ = ("direct", "oldest", "max_sequence_idle_microseconds", "control_input", "state", "iterative_sequence")
    class Control(_message.Message):
        __slots__ = ("kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type")
        class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            CONTROL_SEQUENCE_START: _ClassVar[ModelSequenceBatching.Control.Kind]
            CONTROL_SEQUENCE_READY: _ClassVar[ModelSequenceBatching.Control.Kind]
            CONTROL_SEQUENCE_END: _ClassVar[ModelSequenceBatching.Control.Kind]
            CONTROL_SEQUENCE_CORRID: _ClassVar[ModelSequenceBatching.Control.Kind]
        CONTROL_SEQUENCE_START: ModelSequenceBatching.Control.Kind
        CONTROL_SEQUENCE_READY: ModelSequenceBatching.Control.Kind
        CONTROL_SEQUENCE_END: ModelSequenceBatching.Control.Kind
        CONTROL_SEQUENCE_CORRID: ModelSequenceBatching.Control.Kind
        KIND_FIELD_NUMBER: _ClassVar[int]
        INT32_FALSE_TRUE_FIELD_NUMBER: _ClassVar[int]
        FP32_FALSE_TRUE_FIELD_NUMBER: _ClassVar[int]
        BOOL_FALSE_TRUE_FIELD_NUMBER: _ClassVar[int]
        DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
        kind: ModelSequenceBatching.Control.Kind
        int32_false_true: _containers.RepeatedScalarFieldContainer[int]
        fp32_false_true: _containers.RepeatedScalarFieldContainer[float]
        bool_false_true: _containers.RepeatedScalarFieldContainer[bool]
        data_type: DataType
        def __init__(self, kind: _Optional[_Union[ModelSequenceBatching.Control.Kind, str]] = ..., int32_false_true: _Optional[_Iterable[int]] = ..., fp32_false_true: _Optional[_Iterable[float]] = ..., bool_false_true: _Optional[_Iterable[bool]] = ..., data_type: _Optional[_Union[DataType, str]] = ...) -> None: ...
    class ControlInput(_message.Message):
        __slots__ = ("name", "control")
        NAME_FIELD_NUMBER: _ClassVar[int]
        CONTROL_FIELD_NUMBER: _ClassVar[int]
        name: str
        control: _containers.RepeatedCompositeFieldContainer[ModelSequenceBatching.Control]
        def __init__(self, name: _Optional[str] = ..., control: _Optional[_Iterable[_Union[ModelSequenceBatching.Control, _Mapping]]] = ...) -> None: ...
    class InitialState(_message.Message):
        __slots__ = ("data_type", "dims", "zero_data", "data_file", "name")
        DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
        DIMS_FIELD_NUMBER: _ClassVar[int]
        ZERO_DATA_FIELD_NUMBER: _ClassVar[int]
        DATA_FILE_FIELD_NUMBER: _ClassVar[int]
        NAME_FIELD_NUMBER: _ClassVar[int]
        data_type: DataType
        dims: _containers.RepeatedScalarFieldContainer[int]
        zero_data: bool
        data_file: str
        name: str
        def __init__(self, data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ..., zero_data: _Optional[bool] = ..., data_file: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...
    class State(_message.Message):
        __slots__ = ("input_name", "output_name", "data_type", "dims", "initial_state", "use_same_buffer_for_input_output", "use_growable_memory")
        INPUT_NAME_FIELD_NUMBER: _ClassVar[int]
        OUTPUT_NAME_FIELD_NUMBER: _ClassVar[int]
        DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
        DIMS_FIELD_NUMBER: _ClassVar[int]
        INITIAL_STATE_FIELD_NUMBER: _ClassVar[int]
        USE_SAME_BUFFER_FOR_INPUT_OUTPUT_FIELD_NUMBER: _ClassVar[int]
        USE_GROWABLE_MEMORY_FIELD_NUMBER: _ClassVar[int]
        input_name: str
        output_name: str
        data_type: DataType
        dims: _containers.RepeatedScalarFieldContainer[int]
        initial_state: _containers.RepeatedCompositeFieldContainer[ModelSequenceBatching.InitialState]
        use_same_buffer_for_input_output: bool
        use_growable_memory: bool
        def __init__(self, input_name: _Optional[str] = ..., output_name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ..., initial_state: _Optional[_Iterable[_Union[ModelSequenceBatching.InitialState, _Mapping]]] = ..., use_same_buffer_for_input_output: _Optional[bool] = ..., use_growable_memory: _Optional[bool] = ...) -> None: ...
    class StrategyDirect(_message.Message):
        __slots__ = ("max_queue_delay_microseconds", "minimum_slot_utilization")
        MAX_QUEUE_DELAY_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
        MINIMUM_SLOT_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
        max_queue_delay_microseconds: int
        minimum_slot_utilization: float
        def __init__(self, max_queue_delay_microseconds: _Optional[int] = ..., minimum_slot_utilization: _Optional[float] = ...) -> None: ...
    class StrategyOldest(_message.Message):
        __slots__ = ("max_candidate_sequences", "preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering")
        MAX_CANDIDATE_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
        PREFERRED_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
        MAX_QUEUE_DELAY_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
        PRESERVE_ORDERING_FIELD_NUMBER: _ClassVar[int]
        max_candidate_sequences: int
        preferred_batch_size: _containers.RepeatedScalarFieldContainer[int]
        max_queue_delay_microseconds: int
        preserve_ordering: bool
        def __init__(self, max_candidate_sequences: _Optional[int] = ..., preferred_batch_size: _Optional[_Iterable[int]] = ..., max_queue_delay_microseconds: _Optional[int] = ..., preserve_ordering: _Optional[bool] = ...) -> None: ...
    DIRECT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_IDLE_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_INPUT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ITERATIVE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    direct: ModelSequenceBatching.StrategyDirect
    oldest: ModelSequenceBatching.StrategyOldest
    max_sequence_idle_microseconds: int
    control_input: _containers.RepeatedCompositeFieldContainer[ModelSequenceBatching.ControlInput]
    state: _containers.RepeatedCompositeFieldContainer[ModelSequenceBatching.State]
    iterative_sequence: bool
    def __init__(self, direct: _Optional[_Union[ModelSequenceBatching.StrategyDirect, _Mapping]] = ..., oldest: _Optional[_Union[ModelSequenceBatching.StrategyOldest, _Mapping]] = ..., max_sequence_idle_microseconds: _Optional[int] = ..., control_input: _Optional[_Iterable[_Union[ModelSequenceBatching.ControlInput, _Mapping]]] = ..., state: _Optional[_Iterable[_Union[ModelSequenceBatching.State, _Mapping]]] = ..., iterative_sequence: _Optional[bool] = ...) -> None: ...

class ModelParameter(_message.Message):
    __slots__ = ("string_value",)
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    def __init__(self, string_value: _Optional[str] = ...) -> None: ...

class ModelTransactionPolicy(_message.Message):
    __slots__ = ("decoupled",)
    DECOUPLED_FIELD_NUMBER: _ClassVar[int]
    decoupled: bool
    def __init__(self, decoupled: _Optional[bool] = ...) -> None: ...

class ModelEnsembling(_message.Message):
    __slots__ = ("step",)
    class Step(_message.Message):
        __slots__ = ("model_name", "model_version", "input_map", "output_map", "model_namespace")
        class InputMapEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: str
            def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
        class OutputMapEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: str
            def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
        MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
        MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
        INPUT_MAP_FIELD_NUMBER: _ClassVar[int]
        OUTPUT_MAP_FIELD_NUMBER: _ClassVar[int]
        MODEL_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
        model_name: str
        model_version: int
        input_map: _containers.ScalarMap[str, str]
        output_map: _containers.ScalarMap[str, str]
        model_namespace: str
        def __init__(self, model_name: _Optional[str] = ..., model_version: _Optional[int] = ..., input_map: _Optional[_Mapping[str, str]] = ..., output_map: _Optional[_Mapping[str, str]] = ..., model_namespace: _Optional[str] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: _containers.RepeatedCompositeFieldContainer[ModelEnsembling.Step]
    def __init__(self, step: _Optional[_Iterable[_Union[ModelEnsembling.Step, _Mapping]]] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ("name", "platform", "version_policy", "max_batch_size", "input", "output", "instance_group", "dynamic_batching", "sequence_batching", "ensemble_scheduling", "parameters", "backend", "model_transaction_policy", "model_repository_agents", "response_cache")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ModelParameter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ModelParameter, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    VERSION_POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_GROUP_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_BATCHING_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_BATCHING_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_SCHEDULING_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_TRANSACTION_POLICY_FIELD_NUMBER: _ClassVar[int]
    MODEL_REPOSITORY_AGENTS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_CACHE_FIELD_NUMBER: _ClassVar[int]
    name: str
    platform: str
    version_policy: ModelVersionPolicy
    max_batch_size: int
    input: _containers.RepeatedCompositeFieldContainer[ModelInput]
    output: _containers.RepeatedCompositeFieldContainer[ModelOutput]
    instance_group: _containers.RepeatedCompositeFieldContainer[ModelInstanceGroup]
    dynamic_batching: ModelDynamicBatching
    sequence_batching: ModelSequenceBatching
    ensemble_scheduling: ModelEnsembling
    parameters: _containers.MessageMap[str, ModelParameter]
    backend: str
    model_transaction_policy: ModelTransactionPolicy
    model_repository_agents: ModelRepositoryAgents
    response_cache: ModelResponseCache
    def __init__(self, name: _Optional[str] = ..., platform: _Optional[str] = ..., version_policy: _Optional[_Union[ModelVersionPolicy, _Mapping]] = ..., max_batch_size: _Optional[int] = ..., input: _Optional[_Iterable[_Union[ModelInput, _Mapping]]] = ..., output: _Optional[_Iterable[_Union[ModelOutput, _Mapping]]] = ..., instance_group: _Optional[_Iterable[_Union[ModelInstanceGroup, _Mapping]]] = ..., dynamic_batching: _Optional[_Union[ModelDynamicBatching, _Mapping]] = ..., sequence_batching: _Optional[_Union[ModelSequenceBatching, _Mapping]] = ..., ensemble_scheduling: _Optional[_Union[ModelEnsembling, _Mapping]] = ..., parameters: _Optional[_Mapping[str, ModelParameter]] = ..., backend: _Optional[str] = ..., model_transaction_policy: _Optional[_Union[ModelTransactionPolicy, _Mapping]] = ..., model_repository_agents: _Optional[_Union[ModelRepositoryAgents, _Mapping]] = ..., response_cache: _Optional[_Union[ModelResponseCache, _Mapping]] = ...) -> None: ...

class ModelRepositoryAgents(_message.Message):
    __slots__ = ("agents",)
    class Agent(_message.Message):
        __slots__ = ("name", "parameters")
        class ParametersEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: str
            def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        PARAMETERS_FIELD_NUMBER: _ClassVar[int]
        name: str
        parameters: _containers.ScalarMap[str, str]
        def __init__(self, name: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ...) -> None: ...
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[ModelRepositoryAgents.Agent]
    def __init__(self, agents: _Optional[_Iterable[_Union[ModelRepositoryAgents.Agent, _Mapping]]] = ...) -> None: ...

class ModelResponseCache(_message.Message):
    __slots__ = ("enable",)
    ENABLE_FIELD_NUMBER: _ClassVar[int]
    enable: bool
    def __init__(self, enable: _Optional[bool] = ...) -> None: ...

class ModelConfigRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ModelConfigResponse(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: ModelConfig
    def __init__(self, config: _Optional[_Union[ModelConfig, _Mapping]] = ...) -> None: ...

class ModelStatisticsRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class StatisticDuration(_message.Message):
    __slots__ = ("count", "ns")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    NS_FIELD_NUMBER: _ClassVar[int]
    count: int
    ns: int
    def __init__(self, count: _Optional[int] = ..., ns: _Optional[int] = ...) -> None: ...

class InferStatistics(_message.Message):
    __slots__ = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INPUT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INFER_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISS_FIELD_NUMBER: _ClassVar[int]
    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    cache_hit: StatisticDuration
    cache_miss: StatisticDuration
    def __init__(self, success: _Optional[_Union[StatisticDuration, _Mapping]] = ..., fail: _Optional[_Union[StatisticDuration, _Mapping]] = ..., queue: _Optional[_Union[StatisticDuration, _Mapping]] = ..., compute_input: _Optional[_Union[StatisticDuration, _Mapping]] = ..., compute_infer: _Optional[_Union[StatisticDuration, _Mapping]] = ..., compute_output: _Optional[_Union[StatisticDuration, _Mapping]] = ..., cache_hit: _Optional[_Union[StatisticDuration, _Mapping]] = ..., cache_miss: _Optional[_Union[StatisticDuration, _Mapping]] = ...) -> None: ...

class InferBatchStatistics(_message.Message):
    __slots__ = ("batch_size", "compute_input", "compute_infer", "compute_output")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INPUT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INFER_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    def __init__(self, batch_size: _Optional[int] = ..., compute_input: _Optional[_Union[StatisticDuration, _Mapping]] = ..., compute_infer: _Optional[_Union[StatisticDuration, _Mapping]] = ..., compute_output: _Optional[_Union[StatisticDuration, _Mapping]] = ...) -> None: ...

class ModelStatistics(_message.Message):
    __slots__ = ("name", "version", "last_inference", "inference_count", "execution_count", "inference_stats", "batch_stats", "memory_usage", "response_stats")
    class ResponseStatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: InferResponseStatistics
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[InferResponseStatistics, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_INFERENCE_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_COUNT_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_STATS_FIELD_NUMBER: _ClassVar[int]
    BATCH_STATS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_STATS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    last_inference: int
    inference_count: int
    execution_count: int
    inference_stats: InferStatistics
    batch_stats: _containers.RepeatedCompositeFieldContainer[InferBatchStatistics]
    memory_usage: _containers.RepeatedCompositeFieldContainer[MemoryUsage]
    response_stats: _containers.MessageMap[str, InferResponseStatistics]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., last_inference: _Optional[int] = ..., inference_count: _Optional[int] = ..., execution_count: _Optional[int] = ..., inference_stats: _Optional[_Union[InferStatistics, _Mapping]] = ..., batch_stats: _Optional[_Iterable[_Union[InferBatchStatistics, _Mapping]]] = ..., memory_usage: _Optional[_Iterable[_Union[MemoryUsage, _Mapping]]] = ..., response_stats: _Optional[_Mapping[str, InferResponseStatistics]] = ...) -> None: ...

class MemoryUsage(_message.Message):
    __slots__ = ("type", "id", "byte_size")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    type: str
    id: int
    byte_size: int
    def __init__(self, type: _Optional[str] = ..., id: _Optional[int] = ..., byte_size: _Optional[int] = ...) -> None: ...

class InferResponseStatistics(_message.Message):
    __slots__ = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")
    COMPUTE_INFER_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    EMPTY_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    success: StatisticDuration
    fail: StatisticDuration
    empty_response: StatisticDuration
    cancel: StatisticDuration
    def __init__(self, compute_infer: _Optional[_Union[StatisticDuration, _Mapping]] = ..., compute_output: _Optional[_Union[StatisticDuration, _Mapping]] = ..., success: _Optional[_Union[StatisticDuration, _Mapping]] = ..., fail: _Optional[_Union[StatisticDuration, _Mapping]] = ..., empty_response: _Optional[_Union[StatisticDuration, _Mapping]] = ..., cancel: _Optional[_Union[StatisticDuration, _Mapping]] = ...) -> None: ...

class ModelStatisticsResponse(_message.Message):
    __slots__ = ("model_stats",)
    MODEL_STATS_FIELD_NUMBER: _ClassVar[int]
    model_stats: _containers.RepeatedCompositeFieldContainer[ModelStatistics]
    def __init__(self, model_stats: _Optional[_Iterable[_Union[ModelStatistics, _Mapping]]] = ...) -> None: ...

class ModelRepositoryParameter(_message.Message):
    __slots__ = ("bool_param", "int64_param", "string_param", "bytes_param")
    BOOL_PARAM_FIELD_NUMBER: _ClassVar[int]
    INT64_PARAM_FIELD_NUMBER: _ClassVar[int]
    STRING_PARAM_FIELD_NUMBER: _ClassVar[int]
    BYTES_PARAM_FIELD_NUMBER: _ClassVar[int]
    bool_param: bool
    int64_param: int
    string_param: str
    bytes_param: bytes
    def __init__(self, bool_param: _Optional[bool] = ..., int64_param: _Optional[int] = ..., string_param: _Optional[str] = ..., bytes_param: _Optional[bytes] = ...) -> None: ...

class RepositoryIndexRequest(_message.Message):
    __slots__ = ("repository_name", "ready")
    REPOSITORY_NAME_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    repository_name: str
    ready: bool
    def __init__(self, repository_name: _Optional[str] = ..., ready: _Optional[bool] = ...) -> None: ...

class RepositoryIndexResponse(_message.Message):
    __slots__ = ("models",)
    class ModelIndex(_message.Message):
        __slots__ = ("name", "version", "state", "reason")
        NAME_FIELD_NUMBER: _ClassVar[int]
        VERSION_FIELD_NUMBER: _ClassVar[int]
        STATE_FIELD_NUMBER: _ClassVar[int]
        REASON_FIELD_NUMBER: _ClassVar[int]
        name: str
        version: str
        state: str
        reason: str
        def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[RepositoryIndexResponse.ModelIndex]
    def __init__(self, models: _Optional[_Iterable[_Union[RepositoryIndexResponse.ModelIndex, _Mapping]]] = ...) -> None: ...

class RepositoryModelLoadRequest(_message.Message):
    __slots__ = ("repository_name", "model_name", "parameters")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ModelRepositoryParameter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ModelRepositoryParameter, _Mapping]] = ...) -> None: ...
    REPOSITORY_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    repository_name: str
    model_name: str
    parameters: _containers.MessageMap[str, ModelRepositoryParameter]
    def __init__(self, repository_name: _Optional[str] = ..., model_name: _Optional[str] = ..., parameters: _Optional[_Mapping[str, ModelRepositoryParameter]] = ...) -> None: ...

class RepositoryModelLoadResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RepositoryModelUnloadRequest(_message.Message):
    __slots__ = ("repository_name", "model_name", "parameters")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ModelRepositoryParameter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ModelRepositoryParameter, _Mapping]] = ...) -> None: ...
    REPOSITORY_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    repository_name: str
    model_name: str
    parameters: _containers.MessageMap[str, ModelRepositoryParameter]
    def __init__(self, repository_name: _Optional[str] = ..., model_name: _Optional[str] = ..., parameters: _Optional[_Mapping[str, ModelRepositoryParameter]] = ...) -> None: ...

class RepositoryModelUnloadResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SystemSharedMemoryStatusRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SystemSharedMemoryStatusResponse(_message.Message):
    __slots__ = ("regions",)
    class RegionStatus(_message.Message):
        __slots__ = ("name", "key", "offset", "byte_size")
        NAME_FIELD_NUMBER: _ClassVar[int]
        KEY_FIELD_NUMBER: _ClassVar[int]
        OFFSET_FIELD_NUMBER: _ClassVar[int]
        BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
        name: str
        key: str
        offset: int
        byte_size: int
        def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ..., offset: _Optional[int] = ..., byte_size: _Optional[int] = ...) -> None: ...
    class RegionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SystemSharedMemoryStatusResponse.RegionStatus
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SystemSharedMemoryStatusResponse.RegionStatus, _Mapping]] = ...) -> None: ...
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.MessageMap[str, SystemSharedMemoryStatusResponse.RegionStatus]
    def __init__(self, regions: _Optional[_Mapping[str, SystemSharedMemoryStatusResponse.RegionStatus]] = ...) -> None: ...

class SystemSharedMemoryRegisterRequest(_message.Message):
    __slots__ = ("name", "key", "offset", "byte_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: str
    offset: int
    byte_size: int
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ..., offset: _Optional[int] = ..., byte_size: _Optional[int] = ...) -> None: ...

class SystemSharedMemoryRegisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SystemSharedMemoryUnregisterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SystemSharedMemoryUnregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LogSettingsRequest(_message.Message):
    __slots__ = ("settings",)
    class SettingValue(_message.Message):
        __slots__ = ("bool_param", "uint32_param", "string_param")
        BOOL_PARAM_FIELD_NUMBER: _ClassVar[int]
        UINT32_PARAM_FIELD_NUMBER: _ClassVar[int]
        STRING_PARAM_FIELD_NUMBER: _ClassVar[int]
        bool_param: bool
        uint32_param: int
        string_param: str
        def __init__(self, bool_param: _Optional[bool] = ..., uint32_param: _Optional[int] = ..., string_param: _Optional[str] = ...) -> None: ...
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: LogSettingsRequest.SettingValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[LogSettingsRequest.SettingValue, _Mapping]] = ...) -> None: ...
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.MessageMap[str, LogSettingsRequest.SettingValue]
    def __init__(self, settings: _Optional[_Mapping[str, LogSettingsRequest.SettingValue]] = ...) -> None: ...

class LogSettingsResponse(_message.Message):
    __slots__ = ("settings",)
    class SettingValue(_message.Message):
        __slots__ = ("bool_param", "uint32_param", "string_param")
        BOOL_PARAM_FIELD_NUMBER: _ClassVar[int]
        UINT32_PARAM_FIELD_NUMBER: _ClassVar[int]
        STRING_PARAM_FIELD_NUMBER: _ClassVar[int]
        bool_param: bool
        uint32_param: int
        string_param: str
        def __init__(self, bool_param: _Optional[bool] = ..., uint32_param: _Optional[int] = ..., string_param: _Optional[str] = ...) -> None: ...
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: LogSettingsResponse.SettingValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[LogSettingsResponse.SettingValue, _Mapping]] = ...) -> None: ...
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.MessageMap[str, LogSettingsResponse.SettingValue]
    def __init__(self, settings: _Optional[_Mapping[str, LogSettingsResponse.SettingValue]] = ...) -> None: ...

class TraceSettingRequest(_message.Message):
    __slots__ = ("settings", "model_name")
    class SettingValue(_message.Message):
        __slots__ = ("value",)
        VALUE_FIELD_NUMBER: _ClassVar[int]
        value: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, value: _Optional[_Iterable[str]] = ...) -> None: ...
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TraceSettingRequest.SettingValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TraceSettingRequest.SettingValue, _Mapping]] = ...) -> None: ...
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.MessageMap[str, TraceSettingRequest.SettingValue]
    model_name: str
    def __init__(self, settings: _Optional[_Mapping[str, TraceSettingRequest.SettingValue]] = ..., model_name: _Optional[str] = ...) -> None: ...

class TraceSettingResponse(_message.Message):
    __slots__ = ("settings",)
    class SettingValue(_message.Message):
        __slots__ = ("value",)
        VALUE_FIELD_NUMBER: _ClassVar[int]
        value: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, value: _Optional[_Iterable[str]] = ...) -> None: ...
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TraceSettingResponse.SettingValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TraceSettingResponse.SettingValue, _Mapping]] = ...) -> None: ...
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.MessageMap[str, TraceSettingResponse.SettingValue]
    def __init__(self, settings: _Optional[_Mapping[str, TraceSettingResponse.SettingValue]] = ...) -> None: ...
