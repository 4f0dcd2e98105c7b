"""What the simulated device raises when a program does what the chip would refuse: one line naming the
net, the group and the command (an address outside its region, a local-memory overrun, ...)."""

from __future__ import annotations

from llmbuild import LlmbuildError


class DeviceFault(LlmbuildError):
    pass
