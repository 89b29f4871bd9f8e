"""The one exception type users see.

Anything raised as `RcllmError` is a problem with the user's input or environment (a missing
weights file, an unknown candidate id, a prompt longer than the context). The CLI prints its
message without a traceback; everything else is a bug and keeps its traceback.
"""


class RcllmError(Exception):
    """A user-facing error; its message names the problem and, where possible, the fix."""


def read_json_file(path: str, missing: str, label: str):
    """The JSON document a user named at `path`; RcllmError(`missing`) when there is no such
    file, and "`label` is not JSON: ..." when it does not parse."""
    import json
    import os

    if not os.path.isfile(path):
        raise RcllmError(missing)
    with open(path, encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except json.JSONDecodeError as exc:
            raise RcllmError(f"{label} is not JSON: {exc}") from None
