"""The one exception a user sees as one line: every floor raises it (data/ too: the only thing data/ takes
from training/), lifecycle turns it into one line on stderr and a non-zero exit."""


class UserError(Exception):
    """What a user can get wrong (flags, data, paths): one line on stderr and a non-zero exit, no traceback."""


class OutputError(UserError):
    """An output path that cannot be written: reported as one line before any work starts."""


def reason(error):
    """An OSError's reason without its errno prefix ("No space left on device"), else the error's first line."""
    return getattr(error, "strerror", None) or (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
