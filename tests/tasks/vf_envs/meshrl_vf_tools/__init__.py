"""A multi-turn verifiers environment (a test fixture installed on sys.path): a calculator
toolset whose `multiply` is a plain function (a standard-library module and a constant of its
module, no state), which meshrl re-runs in its sandbox from the function's own source."""

import math

import verifiers.v1 as vf

BOUND = 10**9


class Calc(vf.Toolset):
    @vf.tool
    async def multiply(self, a: int, b: int) -> int:
        """a times b"""
        out = math.prod([a, b])
        if abs(out) > BOUND:
            raise ValueError(f"{out} is over {BOUND}")
        return out


class CTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Calc(vf.ToolsetConfig())]

    @vf.reward
    async def right(self, task: vf.TaskData, trace: vf.Trace) -> float:
        return float(trace.last_reply == "56")


class CTaskset(vf.Taskset[CTask, vf.TasksetConfig]):
    def load(self):
        for i in range(4):
            yield CTask(vf.TaskData(prompt=f"{7 + i}*8=", answer=str(56 + 8 * i)),
                        self.config.task)


__all__ = ["CTaskset"]
