"""A single-turn verifiers environment (a test fixture installed on sys.path): `a+b=` tasks,
rewarded 1.0 for the exact sum and 0.5 more (weighted 0) for a reply that is a number."""

import verifiers.v1 as vf


class AddData(vf.TaskData):
    answer: str


class AddTask(vf.Task[AddData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: AddData, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply == task.answer else 0.0

    @vf.reward(weight=0.0)
    async def is_number(self, task: AddData, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.lstrip("-").isdigit() else 0.0


class AddTasksetConfig(vf.TasksetConfig):
    count: int = 30


class AddTaskset(vf.Taskset[AddTask, AddTasksetConfig]):
    def load(self):
        for i in range(self.config.count):
            yield AddTask(AddData(prompt=f"{i}+{2 * i}=", system_prompt="Add.",
                                  answer=str(3 * i)), self.config.task)


__all__ = ["AddTaskset"]
