"""A single-turn verifiers environment (a test fixture installed on sys.path) whose reward is
a regex that backtracks exponentially: `(a+)+b` on a reply of many `a`s and no `b` never ends
(in C, holding the GIL). An honest reply ("ab") scores at once."""

import re

import verifiers.v1 as vf

_SHAPE = re.compile(r"(a+)+b")


class ShapeData(vf.TaskData):
    answer: str


class ShapeTask(vf.Task[ShapeData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def shaped(self, task: ShapeData, trace: vf.Trace) -> float:
        return 1.0 if _SHAPE.fullmatch(trace.last_reply) else 0.0


class ShapeTasksetConfig(vf.TasksetConfig):
    count: int = 4


class ShapeTaskset(vf.Taskset[ShapeTask, ShapeTasksetConfig]):
    def load(self):
        for i in range(self.config.count):
            yield ShapeTask(ShapeData(prompt=f"Write a{'a' * i}b.", answer="ab"),
                            self.config.task)


__all__ = ["ShapeTaskset"]
