"""``sordino strategy share|list|search|show|apply|export|import|validate``.

Strategy bundles (:mod:`sordino.operations.bundles`) live in ``--data-dir``/strategies
as plain files; the built-in ones ship with sordino. ``apply`` sends the bundle's
fragment through ``sordino reconfigure`` on a running server (validated, keys that
need a restart refused by name, verified and rolled back if worse); ``share
--from-live`` reads a running server's configuration (``sordino share-strategy``, the
product brief's name, is the same). docs/operations.md shows them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from sordino.cli.group import Group
from sordino.cli.reconfigure import change_config, get_json, print_entry, read_overlay
from sordino.cli.server_url import token_option, url_option
from sordino.errors import SordinoError

if TYPE_CHECKING:
    from sordino.operations.bundles import Bundle, Registry

__all__ = ["share_strategy", "strategy"]


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _data_dir_option(command: Any) -> Any:
    return click.option(
        "--data-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="The data directory whose strategies/ folder is the registry (default: ~/.sordino).",
    )(command)


def _registry(data_dir: Path | None) -> Registry:
    from sordino.config import ServerConfig
    from sordino.operations.bundles import Registry

    root = (data_dir or ServerConfig().data_dir).expanduser()
    return Registry(root / "strategies")


def _line(bundle: Bundle) -> str:
    meta = bundle.metadata
    origin = "built-in" if bundle.builtin else "registry"
    return (
        f"{meta.name} {meta.version} ({origin}, {meta.license}) [{', '.join(meta.tags)}]"
        f" {meta.description}"
    )


@click.group(cls=Group)
def strategy() -> None:
    """Share, find and apply strategy bundles (named configuration fragments)."""


@strategy.command("share")
@click.option("--name", required=True, help="The strategy's name (lower case, digits, _ . -).")
@click.option("--tags", default="", help="Comma-separated tags, e.g. black_friday,high_traffic.")
@click.option("--description", default="", help="One line saying what it is for.")
@click.option("--license", "license_", required=True, help="An SPDX identifier, e.g. apache-2.0.")
@click.option("--author", default="", help="Who wrote it.")
@click.option("--version", "version", default="1.0.0", help="The bundle's version.")
@click.option("--sordino", "versions", default=">=0.1", help="The sordino versions it fits.")
@click.option("--from-live", is_flag=True, help="Take the fragment from a running server.")
@click.option("--from", "source", type=click.Path(path_type=Path, dir_okay=False),
              help="Take the fragment from a YAML configuration file.")  # fmt: skip
@click.option("--replace", is_flag=True, help="Overwrite a different strategy of that name.")
@_data_dir_option
@url_option
@token_option
def share(
    name: str, tags: str, description: str, license_: str, author: str, version: str,
    versions: str, from_live: bool, source: Path | None, replace: bool,
    data_dir: Path | None, url: str | None, token: str | None,
) -> None:  # fmt: skip
    """Save a configuration's scheduler, memory, self_healing policy as strategy NAME."""
    if from_live == (source is not None):
        _fail("give exactly one of --from-live or --from config.yaml", 2)
    from sordino.operations.bundles import Bundle

    fragment = get_json(url, token, "/v2/sordino/config") if from_live else read_overlay(source)  # type: ignore[arg-type]
    try:
        bundle = Bundle.create(
            fragment, name=name, version=version, description=description, author=author,
            tags=tuple(t.strip() for t in tags.split(",") if t.strip()), license=license_,
            sordino=versions,
        )  # fmt: skip
        folder = _registry(data_dir).save(bundle, replace=replace)
    except SordinoError as exc:
        _fail(str(exc), 2)
    click.echo(f"shared {name} in {folder} (sha256 {bundle.checksum()[:12]}…)")


@strategy.command("list")
@_data_dir_option
def list_(data_dir: Path | None) -> None:
    """List every strategy: the registry's and the built-ins."""
    for bundle in _registry(data_dir).bundles():
        click.echo(_line(bundle))


@strategy.command("search")
@click.argument("term")
@_data_dir_option
def search(term: str, data_dir: Path | None) -> None:
    """List the strategies whose tags, name or description contain TERM."""
    found = _registry(data_dir).search(term)
    if not found:
        click.echo(f"no strategy matches {term!r}")
    for bundle in found:
        click.echo(_line(bundle))


@strategy.command("show")
@click.argument("name")
@_data_dir_option
def show(name: str, data_dir: Path | None) -> None:
    """Print strategy NAME: its metadata, then its configuration fragment."""
    try:
        bundle = _registry(data_dir).get(name)
    except SordinoError as exc:
        _fail(str(exc))
    click.echo("# " + bundle.metadata_text().rstrip().replace("\n", "\n# "))
    click.echo(bundle.config_text, nl=False)


@strategy.command("apply")
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Show the diff and what needs a restart only.")
@click.option("--no-rollback", is_flag=True, help="Keep it even if it makes things worse.")
@click.option("--verify-window", metavar="DURATION", help="How long to watch its effect.")
@_data_dir_option
@url_option
@token_option
def apply(
    name: str, dry_run: bool, no_rollback: bool, verify_window: str | None,
    data_dir: Path | None, url: str | None, token: str | None,
) -> None:  # fmt: skip
    """Apply strategy NAME to a running server through reconfigure."""
    try:
        bundle = _registry(data_dir).get(name)
    except SordinoError as exc:
        _fail(str(exc))
    from sordino.operations.bundles import check

    problems = check(bundle)
    if problems:
        _fail(f"strategy {name!r} cannot be applied: " + "; ".join(problems))
    body: dict[str, Any] = {"config": bundle.fragment, "dry_run": dry_run,
                            "source": f"strategy:{name}@{bundle.metadata.version}"}  # fmt: skip
    if no_rollback:
        body["rollback"] = False
    if verify_window is not None:
        body["verify_window"] = verify_window
    entry = change_config(url, token, body, wait_s=120.0)
    print_entry(entry)
    if entry["result"] == "rolled_back":
        sys.exit(1)


@strategy.command("export")
@click.argument("name")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="The .tar.gz to write.")  # fmt: skip
@_data_dir_option
def export(name: str, output: Path, data_dir: Path | None) -> None:
    """Write strategy NAME as a .tar.gz to share."""
    try:
        _registry(data_dir).export(name, output)
    except SordinoError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot write {output}: {exc.strerror or exc}")
    click.echo(f"exported {name} to {output}")


@strategy.command("import")
@click.argument("archive", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--replace", is_flag=True, help="Overwrite a different strategy of that name.")
@_data_dir_option
def import_(archive: Path, replace: bool, data_dir: Path | None) -> None:
    """Check ARCHIVE (checksum, license, version range, schema) and add it to the registry."""
    from sordino.operations.bundles import read_archive

    try:
        bundle = read_archive(archive)
        folder = _registry(data_dir).save(bundle, replace=replace)
    except SordinoError as exc:
        _fail(str(exc))
    click.echo(f"imported {bundle.name} {bundle.metadata.version} into {folder}")


@strategy.command("validate")
@click.argument("target")
@_data_dir_option
def validate(target: str, data_dir: Path | None) -> None:
    """Check a strategy: an archive, a bundle folder, or a name in the registry."""
    from sordino.operations.bundles import Registry, check, read_archive

    path = Path(target)
    try:
        if path.is_file():
            bundle = read_archive(path)
        elif path.is_dir():
            bundle = Registry(path.parent).read_folder(path)
        else:
            bundle = _registry(data_dir).get(target)
    except SordinoError as exc:
        _fail(str(exc))
    problems = check(bundle)
    if problems:
        _fail(f"strategy {bundle.name!r} is not valid: " + "; ".join(problems))
    click.echo(f"{bundle.name} {bundle.metadata.version}: valid (sha256 {bundle.checksum()[:12]}…)")


def _share_live(**options: Any) -> None:
    share.callback(from_live=True, source=None, **options)  # type: ignore[misc]


share_strategy = click.Command(
    "share-strategy",
    callback=_share_live,
    params=[p for p in share.params if p.name not in ("from_live", "source")],
    short_help="Share the running server's policy as a strategy (strategy share --from-live).",
    help="Save the running server's scheduler, memory, self_healing policy as strategy "
    "NAME: the product brief's name for `sordino strategy share --from-live`.",
)
"""``sordino share-strategy``: the product brief's name for ``strategy share --from-live``."""
