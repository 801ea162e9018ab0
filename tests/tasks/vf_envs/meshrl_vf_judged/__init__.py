"""A verifiers environment scored by an LLM judge (needs network): meshrl refuses it."""

import verifiers.v1 as vf


class QData(vf.TaskData):
    answer: str


class QTask(vf.Task[QData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def nonempty(self, task: QData, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class QTaskset(vf.Taskset[QTask, vf.TasksetConfig]):
    def load(self):
        cfg = vf.TaskConfig.model_validate({"judges": [{"id": "reference"}]})
        for i in range(3):
            yield QTask(QData(prompt=f"Explain {i}.", answer="x"), cfg)


__all__ = ["QTaskset"]
