# pragma version ~=0.4.3
"""
@title Work, verdicts and rewards
@notice A node's provider submits work (pool, node, file sha256, work units). The work item
        is keyed by its work id, keccak256(abi_encode(node, file sha256)): a file is bound to
        the node that submits it, so a copied hash neither blocks the honest submission nor
        passes validation (the rollout file names its node). Units are bounded per file by
        the pool; the provider's stake must cover its nodes to submit or claim.
        Within the item's invalidation window (fixed at submission) a bonded validator may
        accuse it: hard (fraud) or soft (wrong, not fraudulent). An accusation locks
        `verdict_bond` of the validator's bond and the item's reward; a hard one also ejects
        the node from the work's pool (if its provider still has it there). During the
        dispute period other validators may vote on it, and the provider may challenge it (a
        vote to overturn is a challenge too); a challenge leaves validators at least
        `vote_period` to vote. A challenged verdict stands only if at least `quorum` other
        validators uphold it and more uphold than overturn; an unchallenged one stands at the
        end of the dispute period. Anyone settles: an upheld hard verdict slashes the provider by
        `slash_penalty` and wipes the provider's other unchecked items of that node (those
        submitted before the accusation whose windows were still open at it, across node
        generations); an overturned verdict restores the item and hands the validator's locked
        bond to the provider's stake. Valid work earns the pool's rate per unit (fixed at
        submission), claimable once after `lock_period`.
@dev A wipe is O(1) to record: the provider's accusations of a node are numbered, and an item
     notes how many came before it. At a claim, the first accusation after the item that was
     not overturned decides: made before the item's window closed and upheld, the item is
     wiped; still open, the item waits. Overturned accusations are skipped through a
     union-find over their numbers (union by size: at most log2(n) reads), so no count of
     them leaves an item undecided.
     The verdict game (docs/protocol.md, "The verdict game"): a verdict snapshots every
     dispute parameter when it is made; one that no co-validator confirms within the dispute
     period stays open, and challengeable, for UNCONFIRMED_FACTOR periods; a challenge costs the
     provider a deposit (half the verdict bond) and happens once (the window never passes
     the first challenge + vote period); a vote locks half the verdict bond of the voter, lost
     to the winning side; the federator may rule on a challenged verdict (it already holds
     `slash`); a hard verdict supersedes a pending soft one; an upheld hard verdict puts the
     provider's unclaimed work under review for one more period (claims wait, validators may
     accuse any of it). With `dispute_period == 0` (only at deployment: a network whose
     validators are trusted) a verdict is settled in the transaction that makes it.
"""

from . import roles
from . import stake
from . import nodes
from . import pools

uses: roles
uses: stake
uses: nodes
uses: pools

interface Mintable:
    def mint(receiver: address, amount: uint256): nonpayable

SUBMITTED: constant(uint8) = 1
SOFT_INVALIDATED: constant(uint8) = 2
HARD_INVALIDATED: constant(uint8) = 3
CLAIMED: constant(uint8) = 4
ACCUSED: constant(uint8) = 5
MAX_CLAIM: constant(uint256) = 64
MAX_DISPUTE_PERIOD: constant(uint256) = 30 * 86400
# The federator may not make verdicts final at once (nor nearly): below this, nobody can
# challenge in time and the bond is never at risk.
MIN_DISPUTE_PERIOD: constant(uint256) = 60
# An unconfirmed verdict (no co-validator upheld it in its period) stays open this many
# periods, so that a provider away for the first one can still challenge it.
UNCONFIRMED_FACTOR: constant(uint256) = 24
# Validators who may vote on one verdict (each locks a stake, settled one by one).
MAX_VOTERS: constant(uint256) = 8
# A challenge deposit and a vote stake are this fraction of the verdict's bond.
STAKE_DIVISOR: constant(uint256) = 2
# Union-find depth bound: union by size keeps a tree of n numbers at most log2(n) deep.
MAX_DEPTH: constant(uint256) = 64
MASK64: constant(uint256) = 2**64 - 1
# What a claim finds when it looks at the accusations after an item.
CLEAR: constant(uint8) = 0
WIPED: constant(uint8) = 1
DISPUTED: constant(uint8) = 2
# A vote, and the federator's ruling.
UPHOLD: constant(uint8) = 1
OVERTURN: constant(uint8) = 2

struct Work:
    pool: uint256
    node: address
    provider: address
    units: uint256
    reward: uint256
    submitted_at: uint256
    unlock_at: uint256
    judge_until: uint256
    accusations_before: uint256
    status: uint8
    count: uint256  # a batch: the files its root commits to (0: one file)

struct Dispute:
    validator: address
    at: uint256
    index: uint256  # 1 + its number among the provider's accusations of the node; 0: soft
    bond: uint256
    until: uint256  # votes and challenges are taken until then; it settles then
    challenged: bool
    uphold: uint256
    overturn: uint256
    # fixed when the verdict is made (later parameter changes never reach it)
    period: uint256
    vote_period: uint256
    quorum: uint256
    penalty: uint256
    deposit: uint256  # paid by the provider that challenged (0: challenged by a vote, or not)
    ruling: uint8  # the federator's, on a challenged verdict: 0 none, UPHOLD, OVERTURN

event WorkSubmitted:
    work_id: indexed(bytes32)
    pool: indexed(uint256)
    node: indexed(address)
    file_sha256: bytes32
    units: uint256
    reward: uint256

event WorkAccused:
    work_id: indexed(bytes32)
    provider: indexed(address)
    node: indexed(address)
    hard: bool
    index: uint256
    validator: address
    until: uint256

event VerdictChallenged:
    work_id: indexed(bytes32)
    by: indexed(address)
    until: uint256

event VerdictVoted:
    work_id: indexed(bytes32)
    validator: indexed(address)
    uphold: bool

event VerdictRuled:
    work_id: indexed(bytes32)
    uphold: bool

event ReviewOpened:
    provider: indexed(address)
    until: uint256

event VerdictOverturned:
    work_id: indexed(bytes32)
    validator: indexed(address)
    provider: indexed(address)
    forfeited: uint256

event WorkInvalidated:
    work_id: indexed(bytes32)
    node: indexed(address)
    hard: bool
    slashed: uint256
    validator: address

event RewardsWiped:
    provider: indexed(address)
    node: indexed(address)
    index: uint256
    at: uint256

event RewardsClaimed:
    provider: indexed(address)
    amount: uint256
    count: uint256

event WorkParamsSet:
    invalidation_window: uint256
    lock_period: uint256
    slash_penalty: uint256

event DisputeParamsSet:
    verdict_bond: uint256
    dispute_period: uint256
    vote_period: uint256
    quorum: uint256


work_info: public(HashMap[bytes32, Work])
disputes: public(HashMap[bytes32, Dispute])
# provider -> node -> hard accusations made so far; and the work id of each, by number
accusations: public(HashMap[address, HashMap[address, uint256]])
accused_work: public(HashMap[address, HashMap[address, HashMap[uint256, bytes32]]])
# work id -> voter -> UPHOLD / OVERTURN (0: no vote); and the voters, in order
voted: public(HashMap[bytes32, HashMap[address, uint8]])
voters: public(HashMap[bytes32, DynArray[address, MAX_VOTERS]])
# provider -> node -> number -> union-find over overturned accusations, packed: 1 + parent
# (0: a root) | a root's members beyond itself << 64 | 1 + the live number its set leads to
# (0: itself) << 128
skips: HashMap[address, HashMap[address, HashMap[uint256, uint256]]]
# provider -> until when its unclaimed work may be re-judged and its claims wait (set by an
# upheld hard verdict: a caught provider's backlog is reviewed before it is paid)
review_until: public(HashMap[address, uint256])
last_submission: public(HashMap[address, uint256])
pool_work_units: public(HashMap[uint256, uint256])
total_claimed: public(uint256)
invalidation_window: public(uint256)
lock_period: public(uint256)
slash_penalty: public(uint256)
verdict_bond: public(uint256)
dispute_period: public(uint256)
vote_period: public(uint256)
quorum: public(uint256)


@deploy
def __init__(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    self._set_params(invalidation_window, lock_period, slash_penalty)


@external
def submit_work(pool: uint256, node: address, file_sha256: bytes32, units: uint256) -> bytes32:
    """
    @notice Record work done by one of the caller's nodes in an active pool.
    @dev The caller's stake must cover its nodes; the pool may require an interval between
         a node's submissions. The item's invalidation window is fixed now, and the caller's
         unbonded stake cannot leave before it closes.
    @param pool The pool the node works for.
    @param node The node that did the work (the rollout file names it).
    @param file_sha256 The sha256 of the rollout file; a node submits each file once.
    @param units The work units claimed, 1..the pool's `max_units`.
    @return The work id, keccak256(abi_encode(node, file_sha256)).
    """
    wid: bytes32 = self._submit(pool, node, file_sha256, units, 0)
    log WorkSubmitted(work_id=wid, pool=pool, node=node, file_sha256=file_sha256, units=units, reward=self.work_info[wid].reward)
    return wid


@internal
def _submit(pool: uint256, node: address, key: bytes32, units: uint256, count: uint256) -> bytes32:
    # One file (count 0: key is its sha256) or a batch of `count` (key is its root); the
    # item's key binds it to the node either way.
    assert nodes.node_info[node].provider == msg.sender, "work: not node provider"
    assert nodes.node_info[node].pool == pool, "work: node not in pool"
    assert pools.pool_info[pool].status == pools.ACTIVE, "work: pool not active"
    assert units > 0, "work: zero units"
    files: uint256 = max(count, 1)
    assert units <= pools.pool_info[pool].max_units * files, "work: units above pool maximum"
    assert key != empty(bytes32), "work: empty hash"
    stake._check_covered(msg.sender)
    interval: uint256 = pools.pool_info[pool].min_interval
    if interval > 0:
        assert block.timestamp >= self.last_submission[node] + interval, "work: too frequent"
        # a batch counts as `files` submissions: the next one waits for all of them
        self.last_submission[node] = block.timestamp + interval * (files - 1)
    wid: bytes32 = self._work_id(node, key)
    assert self.work_info[wid].status == 0, "work: duplicate file"
    reward: uint256 = units * pools.pool_info[pool].reward_rate
    judge_until: uint256 = block.timestamp + self.invalidation_window
    self.work_info[wid] = Work(
        pool=pool,
        node=node,
        provider=msg.sender,
        units=units,
        reward=reward,
        submitted_at=block.timestamp,
        unlock_at=block.timestamp + self.lock_period,
        judge_until=judge_until,
        accusations_before=self.accusations[msg.sender][node],
        status=SUBMITTED,
        count=count,
    )
    self.pool_work_units[pool] += units
    stake._note_deadline(msg.sender, judge_until)
    return wid


@external
@nonreentrant
def hard_invalidate(work_id: bytes32) -> uint256:
    """
    @notice Accuse work of fraud: its reward is locked, the node ejected from the work's pool
            if its provider still has it there, and `verdict_bond` of the caller's bond locked.
            Upheld, it slashes the provider by `slash_penalty` and wipes its unchecked items
            of that node; overturned, the caller's locked bond goes to the provider.
    @dev Bonded validators only, within the item's invalidation window. Settled at once when
         `dispute_period` is 0.
    @param work_id The work accused.
    @return The amount slashed now (0 while the verdict can be disputed).
    """
    return self._accuse(work_id, True)


@external
@nonreentrant
def soft_invalidate(work_id: bytes32) -> uint256:
    """
    @notice Accuse work of being wrong but not fraudulent (e.g. stale): upheld, the item is
            void, with no slash and no wipe.
    @dev Bonded validators only, within the item's invalidation window; disputable like a
         hard verdict.
    @param work_id The work accused.
    @return Always 0 (a soft verdict slashes nothing).
    """
    return self._accuse(work_id, False)


@external
@nonreentrant
def challenge(work_id: bytes32):
    """
    @notice The accused provider disputes a verdict, paying a deposit (half the verdict's
            bond, from its stake): the verdict then stands only if at least its `quorum` of
            validators other than its maker uphold it and no more overturn it (or the
            federator rules so). Lost to the accuser if the verdict stands; refunded if not.
    @dev The accused work's provider, once, while the verdict is open; the vote then lasts
         at least the verdict's `vote_period` more, and nothing extends it after that.
    @param work_id The accused work.
    """
    self._check_mine(work_id)
    self._check_open(work_id)
    self._challenge(work_id)
    deposit: uint256 = self.disputes[work_id].bond // STAKE_DIVISOR
    stake._take_deposit(msg.sender, deposit)
    self.disputes[work_id].deposit = deposit


@external
def vote(work_id: bytes32, uphold: bool):
    """
    @notice Re-judge a verdict of another validator: uphold it, or overturn it (which also
            challenges it, if nobody has yet). The vote locks half the verdict's bond of the
            caller's bond: on the losing side it goes to the winning one.
    @dev Bonded validators other than the verdict's maker and the accused provider, once
         each, at most MAX_VOTERS, while the verdict is open. `quorum` upholds of an
         unchallenged verdict confirm it: it then stands at its dispute period's end (at once
         when that is past). A vote of the federator is its ruling on a challenged verdict,
         which decides it (votes then only decide which voters lose their stakes): a
         tie-breaker for networks too small for a vote to outnumber one rogue validator (the
         federator already holds `slash` and the validator grants).
    @param work_id The accused work.
    @param uphold True when the caller's own judgment of the file agrees with the verdict.
    """
    self._check_open(work_id)
    if msg.sender == roles.federator:
        # the federator's ruling on a challenged verdict: a tie-breaker for networks too small
        # for a vote to outnumber one rogue validator (it already holds `slash` and the
        # validator grants, so the ruling adds no power)
        assert self.disputes[work_id].challenged, "work: not challenged"
        self.disputes[work_id].ruling = OVERTURN
        if uphold:
            self.disputes[work_id].ruling = UPHOLD
        log VerdictRuled(work_id=work_id, uphold=uphold)
        return
    roles._check_validator()
    assert msg.sender != self.disputes[work_id].validator, "work: own verdict"
    assert msg.sender != self.work_info[work_id].provider, "work: own work"
    assert self.voted[work_id][msg.sender] == 0, "work: already voted"
    challenged: bool = self.disputes[work_id].challenged
    if uphold:
        n: uint256 = self.disputes[work_id].uphold + 1
        self.disputes[work_id].uphold = n
        if not challenged and n >= self.disputes[work_id].quorum:
            # confirmed: stands at the period's end (a provider had that long to challenge)
            self.disputes[work_id].until = self._confirmed_until(work_id)
        self.voted[work_id][msg.sender] = UPHOLD
    else:
        if not challenged:
            self._challenge(work_id)
        self.disputes[work_id].overturn += 1
        self.voted[work_id][msg.sender] = OVERTURN
    stake._lock_bond(msg.sender, self.disputes[work_id].bond // STAKE_DIVISOR)
    self.voters[work_id].append(msg.sender)  # reverts past MAX_VOTERS
    log VerdictVoted(work_id=work_id, validator=msg.sender, uphold=uphold)


@external
@nonreentrant
def settle(work_id: bytes32) -> uint256:
    """
    @notice Make a verdict final once it is due: unchallenged it stands; challenged, the
            federator's ruling decides, else it stands with at least its `quorum` of upholds
            and no fewer than overturns. Stakes move to the winning side.
    @dev Anyone.
    @param work_id The accused work.
    @return The amount slashed.
    """
    self._check_accused(work_id)
    assert block.timestamp >= self.disputes[work_id].until, "work: dispute open"
    upheld: bool = True
    ruling: uint8 = self.disputes[work_id].ruling
    if ruling != 0:
        upheld = ruling == UPHOLD
    elif self.disputes[work_id].challenged:
        uphold: uint256 = self.disputes[work_id].uphold
        upheld = uphold >= self.disputes[work_id].quorum and uphold >= self.disputes[work_id].overturn
    self._pay_voters(work_id, upheld)
    return self._settle(work_id, upheld, self.disputes[work_id].validator, self.disputes[work_id].index, self.disputes[work_id].bond, True)


@external
@nonreentrant
def claim(work_ids: DynArray[bytes32, MAX_CLAIM]) -> uint256:
    """
    @notice Claim the rewards of the caller's unlocked, valid work items (minted to the caller).
    @dev The caller's stake must cover its nodes. Nothing is claimed while a hard verdict
         against the caller is open or its work is under review; an item under an open
         verdict waits.
    @param work_ids The work ids of the items; each can be claimed once.
    @return The amount minted.
    """
    stake._check_covered(msg.sender)
    assert stake.open_verdicts[msg.sender] == 0 and block.timestamp >= self.review_until[msg.sender], "work: under review"
    total: uint256 = 0
    for wid: bytes32 in work_ids:
        self._check_mine(wid)
        status: uint8 = self.work_info[wid].status
        assert status != CLAIMED, "work: already claimed"
        assert status != ACCUSED, "work: disputed"
        assert status == SUBMITTED, "work: invalidated"
        assert block.timestamp >= self.work_info[wid].unlock_at, "work: locked"
        standing: uint8 = self._standing(wid, msg.sender)
        assert standing != WIPED, "work: rewards wiped"
        assert standing != DISPUTED, "work: disputed"
        self.work_info[wid].status = CLAIMED
        total += self.work_info[wid].reward
    self.total_claimed += total
    log RewardsClaimed(provider=msg.sender, amount=total, count=len(work_ids))
    if total > 0:
        extcall Mintable(stake.token.address).mint(msg.sender, total)
    return total


@external
def set_work_params(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    """
    @notice Set the invalidation window, reward lock period and hard-invalidation penalty.
    @dev Federator only. The lock may not be shorter than the window, nor the unbonding delay.
         Work submitted before keeps the window and lock it was submitted under; a verdict
         made before keeps the penalty it was made under.
    @param invalidation_window Seconds after submission during which validators may invalidate.
    @param lock_period Seconds after submission before a reward is claimable.
    @param slash_penalty Stake slashed on a hard invalidation.
    """
    roles._check_federator()
    self._set_params(invalidation_window, lock_period, slash_penalty)


@external
def set_dispute_params(verdict_bond: uint256, dispute_period: uint256, vote_period: uint256, quorum: uint256):
    """
    @notice Set what a verdict puts at stake and how it is disputed.
    @dev Federator only; applies to verdicts made from now on (each verdict keeps the ones it
         was made under). The dispute period is at least MIN_DISPUTE_PERIOD: only a deployment
         may make verdicts final at once.
    @param verdict_bond Bond a validator locks per open verdict (lost if overturned); a
           challenge deposit and a vote stake are half of it.
    @param dispute_period Seconds after a verdict during which it can be challenged.
    @param vote_period Seconds a challenge leaves validators at least to vote.
    @param quorum Upholding votes that confirm a verdict, or let a challenged one stand.
    """
    roles._check_federator()
    self._set_dispute_params(verdict_bond, dispute_period, vote_period, quorum, False)


@external
@view
def claimable(work_id: bytes32) -> bool:
    """
    @notice Whether the work item can be claimed now by its provider (stake aside).
    @param work_id The work item.
    @return True when valid, unclaimed, unlocked, not wiped, under no open verdict, and its
            provider is under no open hard verdict nor review.
    """
    w: Work = self.work_info[work_id]
    return (w.status == SUBMITTED and block.timestamp >= w.unlock_at
            and stake.open_verdicts[w.provider] == 0
            and block.timestamp >= self.review_until[w.provider]
            and self._standing(work_id, w.provider) == CLEAR)


@external
@view
def standing(work_id: bytes32) -> uint8:
    """
    @notice What the verdicts on the provider's node say of a work item so far.
    @param work_id The work item.
    @return 0: clear, 1: wiped by an upheld verdict, 2: under an open verdict.
    """
    return self._standing(work_id, self.work_info[work_id].provider)


@external
@pure
def work_id(node: address, file_sha256: bytes32) -> bytes32:
    """
    @notice The key of the work `node` submits for a file.
    @param node The node that did the work.
    @param file_sha256 The rollout file's sha256.
    @return keccak256(abi_encode(node, file_sha256)).
    """
    return self._work_id(node, file_sha256)


@internal
@pure
def _work_id(node: address, file_sha256: bytes32) -> bytes32:
    return keccak256(abi_encode(node, file_sha256))


@internal
@view
def _root(provider: address, node: address, k: uint256) -> (uint256, uint256):
    # the root of k's set and its packed entry
    r: uint256 = k
    v: uint256 = 0
    for _: uint256 in range(MAX_DEPTH):
        v = self.skips[provider][node][r]
        up: uint256 = v & MASK64
        if up == 0:
            break
        r = up - 1
    return r, v


@internal
@view
def _live(provider: address, node: address, k: uint256) -> uint256:
    # the first accusation from k on that was not overturned (k itself when k was not)
    r: uint256 = 0
    v: uint256 = 0
    r, v = self._root(provider, node, k)
    t: uint256 = v >> 128
    if t == 0:
        return r
    return t - 1


@internal
def _skip(provider: address, node: address, k: uint256):
    # Accusation k was overturned: a look-up that lands on it goes on to k + 1's answer.
    a: uint256 = 0
    va: uint256 = 0
    b: uint256 = 0
    vb: uint256 = 0
    a, va = self._root(provider, node, k)
    b, vb = self._root(provider, node, k + 1)
    target: uint256 = b + 1
    if vb >> 128 != 0:
        target = vb >> 128
    size: uint256 = ((va >> 64) & MASK64) + ((vb >> 64) & MASK64) + 1
    if (va >> 64) & MASK64 > (vb >> 64) & MASK64:
        self.skips[provider][node][b] = a + 1
        self.skips[provider][node][a] = size << 64 | target << 128
    else:
        self.skips[provider][node][a] = b + 1
        self.skips[provider][node][b] = size << 64 | target << 128


@internal
@view
def _standing(work_id: bytes32, provider: address) -> uint8:
    # The first of the provider's accusations of the node made after the item and not
    # overturned decides, if it was made before the item's window closed.
    node: address = self.work_info[work_id].node
    count: uint256 = self.accusations[provider][node]
    before: uint256 = self.work_info[work_id].accusations_before
    if before >= count:
        return CLEAR
    k: uint256 = self._live(provider, node, before)
    if k >= count:
        return CLEAR
    wid: bytes32 = self.accused_work[provider][node][k]
    if self.disputes[wid].at >= self.work_info[work_id].judge_until:
        return CLEAR
    status: uint8 = self.work_info[wid].status
    if status == HARD_INVALIDATED:
        return WIPED
    if status == ACCUSED:
        return DISPUTED
    return CLEAR


@internal
def _accuse(work_id: bytes32, hard: bool) -> uint256:
    roles._check_validator()
    status: uint8 = self.work_info[work_id].status
    assert status != 0, "work: unknown work"
    provider: address = self.work_info[work_id].provider
    superseding: bool = hard and status == ACCUSED and self.disputes[work_id].index == 0
    if superseding:
        self._release_soft(work_id)  # a soft verdict never shields fraud from a hard one
    else:
        assert status == SUBMITTED, "work: not pending"
        assert self.disputes[work_id].validator == empty(address), "work: verdict overturned"
    assert block.timestamp < max(self.work_info[work_id].judge_until, self.review_until[provider]), "work: invalidation window closed"
    node: address = self.work_info[work_id].node
    pool: uint256 = self.work_info[work_id].pool
    bond: uint256 = self.verdict_bond
    period: uint256 = self.dispute_period
    until: uint256 = 0
    # Stored only what is read later: a verdict settled in this transaction (period 0) needs
    # no bond lock and no record but, when hard, its time (the reach of its wipe).
    if period == 0:
        stake._check_bond(msg.sender, bond)
    else:
        # unconfirmed, it stays open UNCONFIRMED_FACTOR periods; a soft one at least until
        # the item's window closes (a hard verdict may still supersede it)
        until = block.timestamp + period * UNCONFIRMED_FACTOR
        if not hard:
            until = max(until, self.work_info[work_id].judge_until)
        stake._lock_bond(msg.sender, bond)
        # every dispute parameter is fixed now
        self.disputes[work_id].validator = msg.sender
        self.disputes[work_id].at = block.timestamp
        self.disputes[work_id].bond = bond
        self.disputes[work_id].until = until
        self.disputes[work_id].period = period
        self.disputes[work_id].vote_period = self.vote_period
        self.disputes[work_id].quorum = self.quorum
        self.disputes[work_id].penalty = self.slash_penalty
    if not superseding:
        self.work_info[work_id].status = ACCUSED
        self.pool_work_units[pool] -= self.work_info[work_id].units
    index: uint256 = 0
    if hard:
        k: uint256 = self.accusations[provider][node]
        self.accused_work[provider][node][k] = work_id
        self.accusations[provider][node] = k + 1
        index = k + 1
        self.disputes[work_id].at = block.timestamp
        if period != 0:
            self.disputes[work_id].index = index
            stake._open_verdict(provider)
        if nodes.node_info[node].provider == provider:
            if nodes.node_info[node].pool == pool:
                pools._eject(pool, node)  # also ends the generation
            else:
                nodes._next_generation(node)
    log WorkAccused(work_id=work_id, provider=provider, node=node, hard=hard, index=index, validator=msg.sender, until=until)
    if period == 0:
        return self._settle(work_id, True, msg.sender, index, 0, False)
    return 0


@internal
def _release_soft(work_id: bytes32):
    # A pending soft verdict gives way to a hard one: it is settled as upheld for its voters
    # (the work is invalid either way) and its bond goes back; its voters do not vote again.
    self._pay_voters(work_id, True)
    stake._release_bond(self.disputes[work_id].validator, self.disputes[work_id].bond)
    self.voters[work_id] = []
    self.disputes[work_id].challenged = False
    self.disputes[work_id].uphold = 0
    self.disputes[work_id].overturn = 0
    self.disputes[work_id].deposit = 0
    self.disputes[work_id].ruling = 0


@internal
def _settle(work_id: bytes32, upheld: bool, validator: address, index: uint256, bond: uint256, disputable: bool) -> uint256:
    provider: address = self.work_info[work_id].provider
    node: address = self.work_info[work_id].node
    if disputable and index != 0:
        stake._close_verdict(provider)
    if not upheld:
        self.work_info[work_id].status = SUBMITTED
        self.pool_work_units[self.work_info[work_id].pool] += self.work_info[work_id].units
        stake._forfeit_bond(validator, bond, provider)
        if index != 0:
            self._skip(provider, node, index - 1)
        log VerdictOverturned(work_id=work_id, validator=validator, provider=provider, forfeited=bond)
        return 0
    if disputable:
        stake._release_bond(validator, bond)
    slashed: uint256 = 0
    if index != 0:
        self.work_info[work_id].status = HARD_INVALIDATED
        penalty: uint256 = self.slash_penalty
        if disputable:
            penalty = self.disputes[work_id].penalty
            # the caught provider's unclaimed work may be re-judged for one more period
            review: uint256 = block.timestamp + self.disputes[work_id].period
            if review > self.review_until[provider]:
                self.review_until[provider] = review
                stake._note_deadline(provider, review)
                log ReviewOpened(provider=provider, until=review)
        slashed = stake._slash(provider, penalty)
        log RewardsWiped(provider=provider, node=node, index=index - 1, at=self.disputes[work_id].at)
    else:
        self.work_info[work_id].status = SOFT_INVALIDATED
    log WorkInvalidated(work_id=work_id, node=node, hard=index != 0, slashed=slashed, validator=validator)
    return slashed


@internal
def _pay_voters(work_id: bytes32, upheld: bool):
    # Each voter on the losing side loses its stake to the side it tried to wrong: the accuser
    # (upheld) or the provider (overturned), who also gets the deposit back or loses it.
    share: uint256 = self.disputes[work_id].bond // STAKE_DIVISOR
    win: uint8 = OVERTURN
    if upheld:
        win = UPHOLD
    lost: uint256 = 0
    for v: address in self.voters[work_id]:
        if self.voted[work_id][v] == win:
            stake._release_bond(v, share)
        else:
            stake._debit_bond(v, share)
            lost += share
    self._pay_rest(work_id, upheld, lost)


@internal
def _pay_rest(work_id: bytes32, upheld: bool, rest: uint256):
    deposit: uint256 = self.disputes[work_id].deposit
    if upheld:
        validator: address = self.disputes[work_id].validator
        stake._deposit_to_bond(deposit, validator)
        stake._credit_bond(validator, rest)
    else:
        provider: address = self.work_info[work_id].provider
        stake._refund_deposit(provider, deposit)
        stake._credit_stake(provider, rest)


@internal
@view
def _confirmed_until(work_id: bytes32) -> uint256:
    until: uint256 = self.disputes[work_id].at + self.disputes[work_id].period
    if self.disputes[work_id].index == 0:
        until = max(until, self.work_info[work_id].judge_until)
    return until


@internal
@view
def _check_mine(work_id: bytes32):
    # one call site per revert reason keeps the contract under the code-size limit
    assert self.work_info[work_id].provider == msg.sender, "work: not your work"


@internal
@view
def _check_accused(work_id: bytes32):
    assert self.work_info[work_id].status == ACCUSED, "work: not accused"


@internal
@view
def _check_open(work_id: bytes32):
    self._check_accused(work_id)
    assert block.timestamp < self.disputes[work_id].until, "work: dispute period over"


@internal
def _challenge(work_id: bytes32):
    # Once per verdict (open: the caller checked); the vote then lasts its vote period, never
    # longer.
    assert not self.disputes[work_id].challenged, "work: already challenged"
    until: uint256 = max(self._confirmed_until(work_id), block.timestamp + self.disputes[work_id].vote_period)
    self.disputes[work_id].challenged = True
    self.disputes[work_id].until = until
    log VerdictChallenged(work_id=work_id, by=msg.sender, until=until)


@internal
def _set_params(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    assert lock_period >= invalidation_window, "work: lock shorter than window"
    stake._set_min_unbonding_delay(invalidation_window)
    self.invalidation_window = invalidation_window
    self.lock_period = lock_period
    self.slash_penalty = slash_penalty
    log WorkParamsSet(invalidation_window=invalidation_window, lock_period=lock_period, slash_penalty=slash_penalty)


@internal
def _set_dispute_params(verdict_bond: uint256, dispute_period: uint256, vote_period: uint256, quorum: uint256, deploying: bool):
    assert dispute_period <= MAX_DISPUTE_PERIOD and vote_period <= MAX_DISPUTE_PERIOD, "work: period too long"
    # only a deployment may make verdicts final at once (a network of trusted validators)
    assert dispute_period >= MIN_DISPUTE_PERIOD or (deploying and dispute_period == 0), "work: dispute period below floor"
    assert dispute_period == 0 or vote_period > 0, "work: zero vote period"
    assert quorum > 0, "work: zero quorum"
    self.verdict_bond = verdict_bond
    self.dispute_period = dispute_period
    self.vote_period = vote_period
    self.quorum = quorum
    log DisputeParamsSet(verdict_bond=verdict_bond, dispute_period=dispute_period, vote_period=vote_period, quorum=quorum)
