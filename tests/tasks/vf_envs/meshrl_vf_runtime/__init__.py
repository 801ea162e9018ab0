"""A verifiers environment whose reward needs a runtime (a box to run commands in)."""

import verifiers.v1 as vf


class RTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def tests_pass(self, task: vf.TaskData, trace: vf.Trace, runtime) -> float:
        return 0.0


class RTaskset(vf.Taskset[RTask, vf.TasksetConfig]):
    def load(self):
        yield RTask(vf.TaskData(prompt="fix the bug"), self.config.task)


__all__ = ["RTaskset"]
