"""Errors raised on bad input; the CLI turns them into one line and a non-zero exit."""


class ScalembError(Exception):
    """Base class for errors scalemb reports to users."""


class InputError(ScalembError):
    """Bad input data; names the file and, when known, the line."""

    def __init__(self, path, message, line=None):
        self.path = str(path)
        self.line = line
        self.reason = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # raised on Dask workers: must survive pickling
        return type(self), (self.path, self.reason, self.line)
