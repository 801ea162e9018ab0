"""A multi-turn verifiers environment for episodes with a tiny policy (a test fixture
installed on sys.path): one tool, `sq`, called `<sq>12</sq>` (a bare JSON argument), prompts
ending in "=". Rewarded 0.75 for the exact square as the last reply and 0.25 for having used
the tool (a tool message in the conversation)."""

import verifiers.v1 as vf


class Squares(vf.Toolset):
    TOOL_PREFIX = None  # the tool's call tag is its bare name

    @vf.tool
    def sq(self, n: int) -> int:
        """n squared"""
        return n * n


class SqData(vf.TaskData):
    answer: str


class SqTask(vf.Task[SqData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Squares(vf.ToolsetConfig())]

    @vf.reward(weight=0.75)
    async def correct(self, task: SqData, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply == task.answer else 0.0

    @vf.reward(weight=0.25)
    async def used_tool(self, task: SqData, trace: vf.Trace) -> float:
        return 1.0 if trace.tool_messages else 0.0


class SqTaskset(vf.Taskset[SqTask, vf.TasksetConfig]):
    def load(self):
        for i in range(8):
            yield SqTask(SqData(prompt=f"{i}^2=", answer=str(i * i)), self.config.task)


__all__ = ["SqTaskset"]
