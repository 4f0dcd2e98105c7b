"""llmbuild: a declarative recipe build system and MLIR-style compiler for LLMs on TPU-class chips."""

from llmbuild import allocator, blas_kernels

blas_kernels.pin()  # before anything imports numpy: one BLAS arithmetic on every host (blas_kernels.py)
allocator.tune_every_process()  # before numpy too: memory without page-fault stalls (allocator.py)

__version__ = "0.1.0"


class LlmbuildError(Exception):
    """A user-facing error: its message is one line naming the file, field or tensor at fault.

    The CLI prints it as ``llmbuild: error: <message>`` and exits 2, never with a traceback.
    """


def one_line(text: str) -> str:
    """`text` safe inside a one-line message: control and other unprintable characters escaped (names
    read from a corrupted or hostile file)."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
                   for c in text)


class ConfigFieldError(LlmbuildError):
    """A model configuration field at fault: `field` is its key (with an index, `layer_types[1]`), so a
    recipe that spells the configuration out can point at that field's line."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class MissingCheckpointError(LlmbuildError):
    """A recipe's checkpoint is not on this machine (the weights are the user's to download)."""
