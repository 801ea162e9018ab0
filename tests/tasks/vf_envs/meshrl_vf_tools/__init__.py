"""A multi-turn verifiers environment: a calculator tool (an MCP toolset its harness serves)."""

import verifiers.v1 as vf


class Calc(vf.Toolset):
    @vf.tool
    async def multiply(self, a: int, b: int) -> int:
        """a times b"""
        return a * b


class CTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Calc(vf.ToolsetConfig())]

    @vf.reward
    async def right(self, task: vf.TaskData, trace: vf.Trace) -> float:
        return float(trace.root_reply.strip() == "56")


class CTaskset(vf.Taskset[CTask, vf.TasksetConfig]):
    def load(self):
        yield CTask(vf.TaskData(prompt="7*8=", answer="56"), self.config.task)


__all__ = ["CTaskset"]
