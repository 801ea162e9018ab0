"""The pool's public rules, typed and in one home (torch-free).

`rules`: `PoolRules` (task, sampling, group size, prompts per file, files per step, async level,
seed, proof profile, prompt format, sampled replay), `RulesPins` and `rules_drift`;
`assignment`: which problems a (node, step, counter, policy version) gets, prompt encoding,
rows; `profiles`: proof profiles; `sampled`: which rows of a file a validator replays on the
model; `logprob_floor`: the range of a log-prob an honest sampler can claim; `verdicts`:
findings, decisions and verdict kinds; `messages`: the work order; `client`: the one reader
of `GET /rules`. Every role that generates or judges takes its rules from here.
"""

from meshrl.pool.assignment import (
    Assignment,
    PromptFormatError,
    counter_refusal,
    encode_prompt,
    prompt_of_row,
    uses_chat,
    work_units,
)
from meshrl.pool.client import (
    PoolRulesError,
    changed_rules,
    check_rules,
    read_rules,
    require_same_rules,
)
from meshrl.pool.limits import file_limits
from meshrl.pool.logprob_floor import GUMBEL_SPAN, LOGPROB_SLACK, bad_logprob_rows, logprob_floor
from meshrl.pool.messages import JoinManifest, WorkOrder, WorkQuery
from meshrl.pool.profiles import (
    PROFILE_FIELD,
    PROFILES,
    PROOF_PROFILES,
    ProfileSpec,
    ProofProfile,
    profile,
    unmet_profile,
)
from meshrl.pool.rules import (
    NO_BATCHES,
    PROMPT_FORMAT_FIELD,
    RULE_FIELDS,
    BatchRule,
    PoolRules,
    PromptFormat,
    RulesPins,
    RulesSpec,
    SamplingSpec,
    rules_diff,
    rules_drift,
    tasks_config,
)
from meshrl.pool.sampled import (
    FULL_REPLAY,
    ReplayRule,
    catch_probability,
    replayed_count,
    replayed_rows,
)
from meshrl.pool.verdicts import Check, Decision, Finding, Severity, VerdictKind, decide, give_up

__all__ = [
    "FULL_REPLAY",
    "GUMBEL_SPAN",
    "LOGPROB_SLACK",
    "NO_BATCHES",
    "PROFILES",
    "PROFILE_FIELD",
    "PROMPT_FORMAT_FIELD",
    "PROOF_PROFILES",
    "RULE_FIELDS",
    "Assignment",
    "BatchRule",
    "Check",
    "Decision",
    "Finding",
    "JoinManifest",
    "PoolRules",
    "PoolRulesError",
    "ProfileSpec",
    "PromptFormat",
    "PromptFormatError",
    "ProofProfile",
    "ReplayRule",
    "RulesPins",
    "RulesSpec",
    "SamplingSpec",
    "Severity",
    "VerdictKind",
    "WorkOrder",
    "WorkQuery",
    "bad_logprob_rows",
    "catch_probability",
    "changed_rules",
    "check_rules",
    "counter_refusal",
    "decide",
    "encode_prompt",
    "file_limits",
    "give_up",
    "logprob_floor",
    "profile",
    "prompt_of_row",
    "read_rules",
    "replayed_count",
    "replayed_rows",
    "require_same_rules",
    "rules_diff",
    "rules_drift",
    "tasks_config",
    "unmet_profile",
    "uses_chat",
    "work_units",
]
