"""The one exception type users see.

Anything raised as `RcllmError` is a problem with the user's input or environment (a missing
weights file, an unknown candidate id, a prompt longer than the context). The CLI prints its
message without a traceback; everything else is a bug and keeps its traceback.
"""


class RcllmError(Exception):
    """A user-facing error; its message names the problem and, where possible, the fix."""
