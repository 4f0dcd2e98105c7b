"""llmbuild: a declarative recipe build system and MLIR-style compiler for LLMs on TPU-class chips."""

__version__ = "0.1.0"


class LlmbuildError(Exception):
    """A user-facing error: its message is one line naming the file, field or tensor at fault.

    The CLI prints it as ``llmbuild: error: <message>`` and exits 2, never with a traceback.
    """



class MissingCheckpointError(LlmbuildError):
    """A recipe's checkpoint is not on this machine (the weights are the user's to download)."""
