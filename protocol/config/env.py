"""What the environment says to a pipeline config: ``CHTXN_<SECTION>_<FIELD>`` overrides
(``overrides``), their names (``override_variables``), and the ``CHTXN_*`` variables chtxn does not
read (``unknown_variables``: a misspelled override would otherwise be ignored silently). Pure: the
caller passes ``os.environ``.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping

import msgspec

from protocol.config.pipeline import PipelineConfig
from protocol.errors import ConfigError

SECTIONS: dict[str, type[msgspec.Struct]] = {
    f.name: f.type for f in msgspec.structs.fields(PipelineConfig) if isinstance(f.type, type)
}  # ``route``, an array of tables, is not a section: it is never set from the environment


#: ``CHTXN_*`` variables chtxn or its tools read that are not config overrides (``unknown_variables``).
OTHER_VARIABLES = ("CHTXN_CONFIG", "CHTXN_FAILPOINTS", "CHTXN_CACHE_DIR")
#: Prefixes of variables the embedded stack and the test harness set for themselves.
OTHER_PREFIXES = ("CHTXN_EMBEDDED_", "CHTXN_TEST_")


def override_variables() -> dict[str, str]:
    """Every ``CHTXN_<SECTION>_<FIELD>`` variable, mapped to the key it overrides (``section.field``)."""
    return {
        f"CHTXN_{section}_{field.name}".upper(): f"{section}.{field.name}"
        for section, cls in SECTIONS.items()
        for field in msgspec.structs.fields(cls)
    }


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The ``CHTXN_*`` variables of ``environ`` that chtxn does not read, sorted, each with the closest
    known name (None when none is close): a misspelled override would otherwise be ignored silently."""
    known = [*override_variables(), *OTHER_VARIABLES]
    found = []
    for var in sorted(environ):
        if not var.startswith("CHTXN_") or var in known or var.startswith(OTHER_PREFIXES):
            continue
        close = difflib.get_close_matches(var, known, n=1, cutoff=0.75)
        found.append((var, close[0] if close else None))
    return found


def is_array(kind: object) -> bool:
    """Whether a config field of type ``kind`` is an array (``list``/``tuple``, ``Annotated`` or not):
    its variable takes comma-separated values."""
    if typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    return typing.get_origin(kind) in (list, tuple)


def overrides(environ: Mapping[str, str]) -> dict[str, dict[str, object]]:
    """The overrides in ``environ``: section -> field -> value."""
    overrides: dict[str, dict[str, object]] = {}
    for section, cls in SECTIONS.items():
        for field in msgspec.structs.fields(cls):
            var = f"CHTXN_{section}_{field.name}".upper()
            if var not in environ:
                continue
            raw = environ[var]
            if (
                field.name == "topics"
                or field.default_factory in (list, tuple)
                or isinstance(field.default, (list, tuple))
            ):
                value: object = [t.strip() for t in raw.split(",") if t.strip()]
            elif isinstance(field.default, dict) or field.default_factory is dict:
                raise ConfigError(
                    f"{var}: {section}.{field.name} is a table and cannot be set from the environment; "
                    "set it in the TOML file",
                    key=f"{section}.{field.name}",
                )
            else:
                value = raw
            overrides.setdefault(section, {})[field.name] = value
    return overrides
