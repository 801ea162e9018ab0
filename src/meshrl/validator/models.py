"""One inference backend per policy version, loaded once and kept while files of it arrive.

Version 0 may come from a local model directory; every version can come from the pool's
shardcast servers (verified, atomic, its manifest signed by the rules' `policy_signer`; with
servers but no signer the cache refuses to exist: `PoolRulesError`). A version that is not
available yet raises
`VersionUnavailable`: the validator's own problem, so the file is retried, never judged on it.
The policy's tokenizer must follow the rules' `prompt_format`: a chat pool whose policy has no
chat template is refused for good (`PoolRulesError`): at start when `model_dir` is local
(`check_prompt_format`), else when the first version is loaded, before any file is judged.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from pathlib import Path
from typing import Any

from meshrl.inference.params import EngineConfig
from meshrl.pool import PoolRulesError, PromptFormat, PromptFormatError, uses_chat
from meshrl.wire.detached import detached

__all__ = ["ModelCache", "VersionUnavailable"]


class VersionUnavailable(RuntimeError):
    """The policy version cannot be fetched (yet)."""


class ModelCache:
    def __init__(self, work_dir: str | Path, model_dir: str, servers: list[str],
                 engine: EngineConfig, keep: int = 3, fetch_timeout: float = 30.0,
                 signer: str | None = None, sync_timeout: float = 120.0,
                 backend: str = "engine", device: str = "cpu", dtype: str = "float32",
                 prompt_format: PromptFormat = "raw", run: str | None = None) -> None:
        if servers and signer is None:
            raise PoolRulesError("refusing to fetch policy versions: the pool's rules name no "
                                 "policy_signer, so no version can be authenticated")
        self.signer, self.run = signer, run  # run: the id the pool's manifests name
        self.root = Path(work_dir) / "policy"
        self.model_dir, self.servers, self.engine_cfg = model_dir, servers, engine
        self.keep, self.fetch_timeout = keep, fetch_timeout
        self.sync_timeout = sync_timeout  # the most one version's fetch may take in all
        self.backend, self.device, self.dtype = backend, device, dtype
        self.engines: OrderedDict[int, Any] = OrderedDict()
        self.configs: dict[int, dict[str, Any]] = {}  # each engine's config.json, parsed
        self.bases: dict[int, int] = {}  # an adapter version's base version
        self.tokenizer: Any = None
        self.prompt_format = prompt_format
        self.loads = 0

    def check_prompt_format(self) -> None:
        """At start: the local policy's tokenizer (`model_dir`) follows the rules'
        `prompt_format`, or `PoolRulesError` (no prompt of this pool could be encoded)."""
        if self.model_dir and self.tokenizer is None:
            from meshrl.model import load_tokenizer

            self._set_tokenizer(load_tokenizer(Path(self.model_dir)))

    def _set_tokenizer(self, tokenizer: Any) -> None:
        try:
            uses_chat(tokenizer, self.prompt_format)
        except PromptFormatError as e:
            raise PoolRulesError(f"refusing to start: {e}") from e
        self.tokenizer = tokenizer

    async def get(self, version: int) -> Any:
        if version in self.engines:
            self.engines.move_to_end(version)
            return self.engines[version]
        path = await self._locate(version)
        engine = await detached(self._load, path, version)
        self.engines[version] = engine
        while len(self.engines) > self.keep:
            self.configs.pop(self.engines.popitem(last=False)[0], None)
        self._prune()
        return engine

    def _prune(self) -> None:
        """Delete the fetched versions older than every version held, but the base of a held
        adapter version (a long pool fetched one every step or two and kept them all: 2.1 GB
        of bfloat16 SmolLM2 versions per validator after 13 steps); a file of an older
        version, rare, fetches it again."""
        import shutil

        oldest = min(self.engines, default=0)
        needed = {*self.engines, *(self.bases[v] for v in self.engines if v in self.bases)}
        for d in self.root.glob("v*"):
            n = d.name[1:]
            if n.isdigit() and int(n) < oldest and int(n) not in needed and d.is_dir():
                shutil.rmtree(d, ignore_errors=True)

    async def _locate(self, version: int) -> Path:
        local = self.root / f"v{version}"
        if (local / "config.json").is_file():
            return local
        if version == 0 and self.model_dir:
            return Path(self.model_dir)
        if not self.servers:
            raise VersionUnavailable(f"policy version {version}: no model_dir / shardcast")
        from meshrl.shardcast import ClientConfig, ShardcastClient

        cfg = ClientConfig(wait_timeout=self.fetch_timeout)
        try:  # bounded as a whole: relays gone mid-transfer never hang the validator
            async with ShardcastClient(self.servers, cfg, publisher=self.signer,
                                       run=self.run) as sc:
                # a delta against a version held here is fetched as the delta alone
                fetch = sc.fetch(local, version, held=self.root)
                res = await asyncio.wait_for(fetch, self.sync_timeout)
                if res.base is not None and res.payload == "adapter":
                    self.bases[version] = res.base  # kept on disk while `version` is held
                return res.path
        except TimeoutError:
            raise VersionUnavailable(f"policy version {version}: not fetched within "
                                     f"{self.sync_timeout:g} s") from None
        except Exception as e:  # any failure to fetch is ours, never the worker's
            raise VersionUnavailable(f"policy version {version}: {e}") from e

    def _load(self, path: Path, version: int) -> Any:
        from meshrl.inference import ReferenceBackend, engine_or_reference
        from meshrl.inference.device import place
        from meshrl.inference.engine import CPUEngine
        from meshrl.model import load_model, load_tokenizer, read_weights
        from meshrl.model.families import read_model_config

        config = read_model_config(path)
        sibling = next((e for v, e in reversed(self.engines.items())
                        if isinstance(e, CPUEngine) and self.configs.get(v) == config), None)
        if sibling is not None:  # same model, new weights: no transformers model built
            engine = sibling.with_weights(read_weights(path), version)
        else:
            model = load_model(path)
            if self.tokenizer is None:
                self._set_tokenizer(load_tokenizer(path))
            if self.backend == "reference":  # on `device` in `dtype` (checked: DeviceError)
                engine = ReferenceBackend(place(model, self.device, self.dtype), self.tokenizer,
                                          version=version)
            else:  # the reference backend where the engine cannot run the model (reason logged)
                engine = engine_or_reference(model, self.tokenizer, self.engine_cfg,
                                             version=version)
        self.loads += 1
        self.configs[version] = config
        return engine
