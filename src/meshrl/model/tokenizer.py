"""Tokenizers: a built-in character tokenizer for synthetic tasks, and HF tokenizers from disk.

Both expose the same small interface (`encode`, `decode`, `vocab_size`, special token ids), so
the trainer, engine and verifiers never care which one they have.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any, Protocol

from meshrl.model.families import ModelNotFoundError

__all__ = ["CHAR_TOKENIZER_FILE", "CharTokenizer", "HFTokenizer", "Tokenizer", "generation_eos_ids",
           "load_tokenizer"]

CHAR_TOKENIZER_FILE = "char_tokenizer.json"


class Tokenizer(Protocol):
    vocab_size: int
    pad_token_id: int
    bos_token_id: int | None
    eos_token_id: int  # the primary stop token (what an SFT answer ends with)
    eos_token_ids: tuple[int, ...]  # every token that ends a completion, eos_token_id first
    has_chat_template: bool

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def save(self, directory: str | Path) -> None: ...


class CharTokenizer:
    """One token per character over printable ASCII, plus <pad>, <bos>, <eos>, <unk>."""

    SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")

    def __init__(self, alphabet: str | None = None) -> None:
        alphabet = alphabet if alphabet is not None else string.printable[:95]  # no \t\n\r\x0b\x0c
        self.alphabet = "".join(dict.fromkeys(alphabet))
        self.itos = list(self.SPECIALS) + list(self.alphabet)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id, self.unk_token_id = 0, 1, 2, 3
        self.eos_token_ids = (self.eos_token_id,)
        self.has_chat_template = False
        self.vocab_size = len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(ch, self.unk_token_id) for ch in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} outside vocabulary of size {self.vocab_size}")
            if i < len(self.SPECIALS):
                if not skip_special_tokens:
                    out.append(self.itos[i])
                continue
            out.append(self.itos[i])
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        return self.stoi.get(token)

    def save(self, directory: str | Path) -> None:
        path = Path(directory) / CHAR_TOKENIZER_FILE
        path.write_text(json.dumps({"type": "char", "alphabet": self.alphabet}))

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        data = json.loads((Path(directory) / CHAR_TOKENIZER_FILE).read_text())
        if data.get("type") != "char":
            raise ValueError(f"{directory}: not a char tokenizer file")
        return cls(data["alphabet"])


class HFTokenizer:
    """Adapter over a `transformers` tokenizer loaded from a local directory.

    `eos_token_ids` are the tokenizer's EOS and every `eos_token_id` of the directory's
    `generation_config.json` (an int or a list: Qwen's `<|im_end|>` and `<|endoftext|>`, Llama
    3's `<|eot_id|>`, `<|eom_id|>`, `<|end_of_text|>`): a completion ends on any of them.
    """

    def __init__(self, tok: Any, extra_eos: tuple[int, ...] = ()) -> None:
        self.tok = tok
        self.vocab_size = len(tok)
        eos = tok.eos_token_id if tok.eos_token_id is not None else (
            extra_eos[0] if extra_eos else None)
        if eos is None:
            raise ValueError("tokenizer has no EOS token; RL completions need one to terminate")
        self.eos_token_id = int(eos)
        self.eos_token_ids = tuple(dict.fromkeys([self.eos_token_id, *map(int, extra_eos)]))
        bad = [t for t in self.eos_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"stop token ids {bad} outside the vocabulary of {self.vocab_size}")
        self.bos_token_id = tok.bos_token_id
        self.has_chat_template = bool(getattr(tok, "chat_template", None))
        pad = tok.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_id)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def chat_prompt(self, text: str) -> str:
        """`text` as the user turn of the chat template, ending where the assistant answers
        (the template writes any BOS itself)."""
        if not self.has_chat_template:
            raise ValueError("tokenizer has no chat template")
        return str(self.tok.apply_chat_template([{"role": "user", "content": text}],
                                                tokenize=False, add_generation_prompt=True))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        tid = self.tok.convert_tokens_to_ids(token)
        return None if tid is None or tid == self.tok.unk_token_id else int(tid)

    def save(self, directory: str | Path) -> None:
        self.tok.save_pretrained(str(directory))


def generation_eos_ids(directory: str | Path) -> tuple[int, ...]:
    """The `eos_token_id`s of a model directory's `generation_config.json` (none without it)."""
    path = Path(directory) / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{path}: unreadable generation config ({e})") from e
    eos = [eos] if isinstance(eos, int) else (eos or [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in eos):
        raise ValueError(f"{path}: eos_token_id must be an integer or a list of integers")
    return tuple(eos)


def load_tokenizer(directory: str | Path) -> CharTokenizer | HFTokenizer:
    """The tokenizer stored in a model directory (char tokenizer file, else a HF tokenizer)."""
    directory = Path(directory)
    if not directory.exists():  # else transformers reads the path as a Hub repo id
        raise ModelNotFoundError(f"model directory {directory} does not exist")
    if (directory / CHAR_TOKENIZER_FILE).is_file():
        return CharTokenizer.load(directory)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"{directory}: no tokenizer found ({e})") from e
    return HFTokenizer(tok, generation_eos_ids(directory))
