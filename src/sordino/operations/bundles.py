"""Strategy bundles: named, versioned configuration fragments to share as plain files.

A bundle is two files in a folder named after it::

    NAME/metadata.yaml   name, version, tags, description, license (SPDX), author,
                         sordino (a version range such as ">=0.1,<2"), sha256
    NAME/config.yaml     the configuration fragment (scheduler, memory, self_healing, …)

``sha256`` is the checksum of ``config.yaml``'s bytes, so a bundle copied through any
git repository or file server can be checked. The local registry is
``<data dir>/strategies``; the built-in strategies ship inside the package
(``operations/strategies/*.yaml``, metadata and config in one file). An exported
bundle is a ``.tar.gz`` of the folder. :func:`check` refuses a bundle whose
checksum, license, version range or fragment is wrong, saying which and why.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from pydantic import Field, ValidationError, field_validator

from sordino import __version__
from sordino.config import validate_config
from sordino.config.base import Section
from sordino.config.bounded import load_yaml
from sordino.errors import ConfigError, InvalidRequest, NotFound

__all__ = [
    "FRAGMENT_SECTIONS",
    "Bundle",
    "BundleMetadata",
    "Registry",
    "builtin_bundles",
    "canonical_license",
    "check",
    "read_archive",
]

FRAGMENT_SECTIONS = ("scheduler", "memory", "self_healing", "reconfigure", "tenants")
"""The sections a strategy may carry: policy, never listeners, models or paths."""

_SPDX = (
    "0BSD", "AGPL-3.0-only", "AGPL-3.0-or-later", "Apache-2.0", "BSD-2-Clause",
    "BSD-3-Clause", "BSL-1.0", "CC-BY-4.0", "CC-BY-SA-4.0", "CC0-1.0", "EPL-2.0",
    "GPL-2.0-only", "GPL-2.0-or-later", "GPL-3.0-only", "GPL-3.0-or-later", "ISC",
    "LGPL-2.1-only", "LGPL-2.1-or-later", "LGPL-3.0-only", "LGPL-3.0-or-later", "MIT",
    "MIT-0", "MPL-2.0", "Unlicense", "Zlib",
)  # fmt: skip
_SPDX_BY_LOWER = {spdx.lower(): spdx for spdx in _SPDX}
_NAME = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


def canonical_license(text: str) -> str:
    """The SPDX identifier ``text`` names (any case), or ``LicenseRef-…``; else ValueError."""
    value = text.strip()
    if value.startswith("LicenseRef-") and len(value) > len("LicenseRef-"):
        return value
    found = _SPDX_BY_LOWER.get(value.lower())
    if found is None:
        raise ValueError(
            f"license {text!r} is not an SPDX identifier this build knows; use one of "
            f"{', '.join(_SPDX)}, or LicenseRef-<name> for your own"
        )
    return found


class BundleMetadata(Section):
    """What a bundle says about itself."""

    name: str = Field(pattern=_NAME)
    version: str = "1.0.0"
    tags: tuple[str, ...] = ()
    description: str = ""
    license: str
    author: str = ""
    sordino: str = ">=0.1"
    """The sordino versions the fragment is written for (a PEP 440 range)."""
    sha256: str | None = None
    """The checksum of config.yaml (set when the bundle is written)."""

    @field_validator("license")
    @classmethod
    def _spdx(cls, value: str) -> str:
        return canonical_license(value)

    @field_validator("sordino")
    @classmethod
    def _range(cls, value: str) -> str:
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(f"{value!r} is not a version range such as '>=0.1,<2'") from None
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        try:
            Version(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a version such as 1.0.0") from None
        return value


@dataclass(frozen=True, slots=True)
class Bundle:
    """A strategy: its metadata and the exact text of its configuration fragment."""

    metadata: BundleMetadata
    config_text: str
    builtin: bool = False

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def fragment(self) -> dict[str, Any]:
        try:
            data = load_yaml(self.config_text, f"strategy {self.name!r}: config.yaml")[0] or {}
        except ConfigError as exc:
            raise InvalidRequest(str(exc)) from None
        return data if isinstance(data, dict) else {}

    def checksum(self) -> str:
        return hashlib.sha256(self.config_text.encode()).hexdigest()

    def sealed(self) -> Bundle:
        """This bundle with ``sha256`` set to its fragment's checksum."""
        metadata = self.metadata.model_copy(update={"sha256": self.checksum()})
        return Bundle(metadata, self.config_text, self.builtin)

    def metadata_text(self) -> str:
        return yaml.safe_dump(self.metadata.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def create(cls, fragment: dict[str, Any], **metadata: Any) -> Bundle:
        """A new sealed bundle of ``fragment`` (only the strategy sections are kept)."""
        kept = {key: value for key, value in fragment.items() if key in FRAGMENT_SECTIONS}
        if not kept:
            raise InvalidRequest(
                f"nothing to share: the configuration has none of {', '.join(FRAGMENT_SECTIONS)}"
            )
        try:
            meta = BundleMetadata(**metadata)
        except ValidationError as exc:
            raise InvalidRequest(_first_error(exc)) from None
        return Bundle(meta, yaml.safe_dump(kept, sort_keys=False)).sealed()


def check(bundle: Bundle) -> list[str]:
    """Every reason ``bundle`` cannot be used here (empty when it can)."""
    problems: list[str] = []
    meta = bundle.metadata
    if meta.sha256 is None:
        problems.append("metadata.yaml has no sha256 of config.yaml")
    elif meta.sha256 != bundle.checksum():
        problems.append(
            f"config.yaml does not match its checksum (sha256 {bundle.checksum()[:12]}…, "
            f"metadata says {meta.sha256[:12]}…): the file was changed or damaged"
        )
    if Version(__version__) not in SpecifierSet(meta.sordino):
        problems.append(
            f"it is written for sordino {meta.sordino}, and this is sordino {__version__}"
        )
    try:
        fragment = bundle.fragment
    except InvalidRequest as exc:
        return [*problems, str(exc)]
    other = sorted(set(fragment) - set(FRAGMENT_SECTIONS))
    if other:
        problems.append(
            f"config.yaml has sections a strategy may not carry: {', '.join(other)} "
            f"(allowed: {', '.join(FRAGMENT_SECTIONS)})"
        )
    try:
        validate_config({k: v for k, v in fragment.items() if k in FRAGMENT_SECTIONS})
    except ConfigError as exc:
        problems.append(f"config.yaml does not validate: {exc}")
    return problems


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg'].removeprefix('Value error, ')}"


def _parse_metadata(text: str, where: str) -> BundleMetadata:
    try:
        data = load_yaml(text, where)[0]
        return BundleMetadata.model_validate(data)
    except ConfigError as exc:
        raise InvalidRequest(str(exc)) from None
    except ValidationError as exc:
        raise InvalidRequest(f"{where}: {_first_error(exc)}") from None


def builtin_bundles() -> list[Bundle]:
    """The strategies shipped with sordino, sealed."""
    bundles = []
    folder = resources.files("sordino.operations") / "strategies"
    for item in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if not item.name.endswith(".yaml"):
            continue
        document = load_yaml(item.read_text("utf-8"), f"built-in strategy {item.name}")[0]
        metadata = BundleMetadata.model_validate(document["metadata"])
        text = yaml.safe_dump(document["config"], sort_keys=False)
        bundles.append(Bundle(metadata, text, builtin=True).sealed())
    return bundles


def read_archive(path: Path) -> Bundle:
    """The bundle in an exported ``.tar.gz`` (one folder with the two files)."""
    try:
        with tarfile.open(path, "r:gz") as archive:
            files: dict[str, str] = {}
            for member in archive.getmembers():
                if not member.isfile() or member.size > 1 << 20:
                    continue
                extracted = archive.extractfile(member)
                if extracted is not None:
                    files[Path(member.name).name] = extracted.read().decode("utf-8")
    except (OSError, tarfile.TarError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{path} is not a strategy archive (.tar.gz): {exc}") from None
    missing = [name for name in ("metadata.yaml", "config.yaml") if name not in files]
    if missing:
        raise InvalidRequest(f"{path} has no {' or '.join(missing)}; is it a strategy export?")
    return Bundle(
        _parse_metadata(files["metadata.yaml"], f"{path}: metadata.yaml"), files["config.yaml"]
    )


class Registry:
    """The local registry folder, with the built-in strategies behind it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def bundles(self) -> list[Bundle]:
        """Every strategy: the registry's, then the built-ins it does not shadow."""
        found: dict[str, Bundle] = {}
        if self.root.is_dir():
            for folder in sorted(self.root.iterdir()):
                if (folder / "metadata.yaml").is_file():
                    found[folder.name] = self._read(folder)
        for bundle in builtin_bundles():
            found.setdefault(bundle.name, bundle)
        return sorted(found.values(), key=lambda bundle: bundle.name)

    def get(self, name: str) -> Bundle:
        for bundle in self.bundles():
            if bundle.name == name:
                return bundle
        known = ", ".join(bundle.name for bundle in self.bundles())
        raise NotFound(f"no strategy {name!r} in {self.root} or the built-ins; known: {known}")

    def search(self, term: str) -> list[Bundle]:
        """Strategies whose tags, name or description contain ``term`` (any case)."""
        needle = term.lower()
        return [
            bundle
            for bundle in self.bundles()
            if any(needle in tag.lower() for tag in bundle.metadata.tags)
            or needle in bundle.name.lower()
            or needle in bundle.metadata.description.lower()
        ]

    def save(self, bundle: Bundle, *, replace: bool = False) -> Path:
        """Write ``bundle`` into the registry; refuse to overwrite a different one."""
        problems = check(bundle)
        if problems:
            raise InvalidRequest(f"strategy {bundle.name!r} refused: " + "; ".join(problems))
        folder = self.root / bundle.name
        if (folder / "metadata.yaml").is_file() and not replace:
            existing = self._read(folder)
            if existing.checksum() != bundle.checksum():
                raise InvalidRequest(
                    f"a different strategy {bundle.name!r} is already in {self.root}; "
                    "remove it first or pass --replace"
                )
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text(bundle.config_text, encoding="utf-8")
        (folder / "metadata.yaml").write_text(bundle.metadata_text(), encoding="utf-8")
        return folder

    def export(self, name: str, target: Path) -> Path:
        """Write strategy ``name`` as a ``.tar.gz`` at ``target``."""
        bundle = self.get(name)
        with tarfile.open(target, "w:gz") as archive:
            for filename, text in (
                ("metadata.yaml", bundle.metadata_text()),
                ("config.yaml", bundle.config_text),
            ):
                data = text.encode()
                info = tarfile.TarInfo(f"{bundle.name}/{filename}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        return target

    def read_folder(self, folder: Path) -> Bundle:
        """The bundle in ``folder`` (metadata.yaml and config.yaml)."""
        return self._read(folder)

    def _read(self, folder: Path) -> Bundle:
        meta = _parse_metadata(
            (folder / "metadata.yaml").read_text(encoding="utf-8"), f"{folder}/metadata.yaml"
        )
        config = folder / "config.yaml"
        text = config.read_text(encoding="utf-8") if config.is_file() else ""
        return Bundle(meta, text)
