"""A multi-turn verifiers environment whose taskset-wide tool (`kind` picks it) no validator
can re-run exactly: meshrl refuses each, naming the tool and why (a test fixture)."""

import datetime

import verifiers.v1 as vf


class CountState(vf.State):
    calls: int = 0


class Counter(vf.Toolset[vf.ToolsetConfig, CountState]):
    @vf.tool
    async def count(self) -> int:
        """calls so far in this rollout"""
        self.state.calls += 1
        return self.state.calls


class Web(vf.Toolset):
    @vf.tool
    async def fetch(self, url: str) -> str:
        """the page at url"""
        import urllib.request

        return urllib.request.urlopen(url).read().decode()


class Clock(vf.Toolset):
    @vf.tool
    def today(self) -> str:
        """today's date"""
        return datetime.date.today().isoformat()


class Configured(vf.Toolset):
    @vf.tool
    def where(self) -> str:
        """the server's own url"""
        return str(self.config.url)


def _helper(x: int) -> int:
    return x + 1


class Helped(vf.Toolset):
    @vf.tool
    def bump(self, x: int) -> int:
        """x plus one"""
        return _helper(x)


TOOLSETS = {
    "state": lambda: Counter(vf.ToolsetConfig()),
    "web": lambda: Web(vf.ToolsetConfig()),
    "clock": lambda: Clock(vf.ToolsetConfig()),
    "self": lambda: Configured(vf.ToolsetConfig()),
    "helper": lambda: Helped(vf.ToolsetConfig()),
    "remote": lambda: Helped(vf.ToolsetConfig(url="http://127.0.0.1:9/mcp")),
}


class UTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def nonempty(self, task: vf.TaskData, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class UConfig(vf.TasksetConfig):
    kind: str = "state"


class UTaskset(vf.Taskset[UTask, UConfig]):
    @classmethod
    def toolsets(cls, config):
        return [TOOLSETS[config.kind]()]

    def load(self):
        for i in range(3):
            yield UTask(vf.TaskData(prompt=f"go {i}"), self.config.task)


__all__ = ["UTaskset"]
