"""transformers' token2wav ODE taken one DiT evaluation at a time, so many windows can share each forward.

``Qwen2_5OmniToken2WavDiTModel.sample`` integrates from the noise at ``t = 0`` to the mel at ``t = 1`` over
``num_steps`` time points ``linspace(0, 1, num_steps)`` swayed by ``t + sway·(cos(π/2·t) − 1 + t)``, with its
``RungeKutta4ODESolver``: per interval the 3/8-rule Runge–Kutta step, four evaluations, nothing reused
between intervals (``num_steps − 1`` intervals, ``4·(num_steps − 1)`` evaluations).  An
:class:`OdeWindow` holds one window's place in that integration: :meth:`OdeWindow.request` says at which
time and state the next evaluation is wanted, :meth:`OdeWindow.advance` takes its result.  The arithmetic
is the solver's own, operation for operation, so a window decoded alone equals ``sample`` on the same
inputs bit for bit (the evaluations themselves are the caller's).

Not thread-safe: one thread steps a window.
"""

from __future__ import annotations

import torch

ONE_THIRD = 1 / 3
TWO_THIRDS = 2 / 3


def time_points(num_steps: int, sway_coefficient: float | None, device: torch.device | str = "cpu") -> torch.Tensor:
    """The solver's time points, as ``sample`` computes them (float32)."""
    points = torch.linspace(0, 1, num_steps, device=device, dtype=torch.float32)
    if sway_coefficient is not None:
        points += sway_coefficient * (torch.cos(torch.pi / 2 * points) - 1 + points)
    return points


class OdeWindow:
    """One window's integration from ``noise`` (``[frames, mel_dim]``) along ``points`` (module docstring)."""

    def __init__(self, noise: torch.Tensor, points: torch.Tensor) -> None:
        if points.ndim != 1 or points.shape[0] < 2:
            raise ValueError(f"token2wav: the ODE needs at least 2 time points, got {list(points.shape)}")
        self.points = points
        self.value = noise.unsqueeze(0)  # [1, frames, mel_dim], as the solver's batch of one
        self.interval = 0
        self._slopes: list[torch.Tensor] = []

    @property
    def done(self) -> bool:
        return self.interval >= self.points.shape[0] - 1

    @property
    def evaluations_left(self) -> int:
        return 4 * (self.points.shape[0] - 1 - self.interval) - len(self._slopes)

    @property
    def mel(self) -> torch.Tensor:
        """The solution at ``t = 1``, ``[frames, mel_dim]``; only once :attr:`done`."""
        if not self.done:
            raise RuntimeError(f"token2wav: the ODE has {self.evaluations_left} evaluations left")
        return self.value[0]

    def request(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(t, x)`` of the next evaluation: a 0-dim time and the state ``[1, frames, mel_dim]``."""
        start, end = self.points[self.interval], self.points[self.interval + 1]
        step = end - start
        y, k = self.value, self._slopes
        match len(k):
            case 0:
                return start, y
            case 1:
                return start + step * ONE_THIRD, y + step * k[0] * ONE_THIRD
            case 2:
                return start + step * TWO_THIRDS, y + step * (k[1] - k[0] * ONE_THIRD)
            case _:
                return end, y + step * (k[0] - k[1] + k[2])

    def advance(self, slope: torch.Tensor) -> None:
        """Take the evaluation :meth:`request` asked for (``[1, frames, mel_dim]``)."""
        self._slopes.append(slope)
        if len(self._slopes) < 4:
            return
        k1, k2, k3, k4 = self._slopes
        step = self.points[self.interval + 1] - self.points[self.interval]
        self.value = self.value + (k1 + 3 * (k2 + k3) + k4) * step / 8
        self._slopes = []
        self.interval += 1


__all__ = ["ONE_THIRD", "TWO_THIRDS", "OdeWindow", "time_points"]
