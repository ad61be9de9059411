"""One pod's KV-event stream: sequence health, replay, and what reaches the block index.

`epp.kvcache.ingest` owns the sockets and hands each decoded message to its pod's `Feed`. The
index must never keep blocks that a missed `BlockRemoved` would have dropped, so nothing is
applied across a hole in the sequence numbers (reference notes, kv-events.md 1.1-1.2):

- First message: applied; with replay configured and seq > 0 (joining mid-stream), a replay from
  0 first catches up on what the publisher still buffers.
- seq == last + 1: applied.
- Gap (seq > last + 1): with replay, live messages are held (at most `hold_limit` per pod, and
  their payloads at most `hold_bytes` over all pods, `HoldBudget`) while a DEALER
  asks the pod's ROUTER for everything from last + 1 (`[b"", seq8]`); replayed batches are
  applied in order as they arrive, yielding to the loop every `_YIELD_EVERY`, then the held ones.
  If the replay starts after last + 1, has a hole, or stops short of the held messages (the
  publisher no longer has the data), the pod is purged (`BlockIndex.remove_pod`) and what follows
  the hole applied: outcome "partial" (rebuilding from new events, starting from the oldest
  ones the publisher still has). A timeout (`replay_timeout` without a reply),
  a socket error or an overflowing hold buffer purge the pod and go on from the held messages:
  outcome "failed", after which gaps purge without replaying for `replay_cooldown` seconds (a
  dead replay port must not delay every later gap by a timeout). Without replay: purge, then
  apply from this message.
- Live seq <= the previous live seq (the publisher restarted: one publisher's live sequence
  numbers only go up): count a reset, purge, then treat the message as a first one. This holds
  whatever a replay applied and also while a replay runs: that replay (of the old publisher) is
  abandoned with the messages held for it, and the new sequence starts from this message (a
  restart seen during a join replay from 0 must not pass for replayed duplicates).
- seq <= last but above the previous live seq: a batch a replay already applied that was still
  queued in the SUB: skipped as a duplicate, not taken for a restart, and counted (errors reason
  `out_of_order`), as are replayed batches older than the one the replay expects.
- After the SUB lost its connection (socket monitor, connect mode only): purged when it connects
  again (unless a replay is under way), and the first live message is treated as a first one
  (join), whatever its seq: a publisher restarted meanwhile may
  already be past the old one's last seq, which would pass for a gap and be "repaired" with the
  new process's batches on top of the old one's blocks. A reconnection to the same process thus
  costs a rebuild (a replay from 0 when configured).

At most `max_replays` replays run at once over all pods (the others hold their messages and
wait). Replies are accepted in both vLLM styles: after the empty delimiter, `[seq, payload]` (0.9-0.25)
or `[topic, seq, payload]` (0.26+); the end is an empty payload or a sequence frame of 8 x 0xff.

Rejected messages are counted per pod and reason; warnings are rate-limited per pod (one line
per `log_interval`, with the count of those suppressed). So are the lines about the sequence
(gaps, restarts, reconnections, replay outcomes: one per `log_interval` per pod and kind): a
publisher that skips a number in every batch wrote one line per message, 9,166 in 3.8 s; the
counters (`epp_kv_events_gaps_total`, resets, replays) still count each.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Final, Literal

import zmq
import zmq.asyncio

from epp import tasks
from epp.kvcache import events
from epp.kvcache.index import BlockIndex
from epp.kvcache.silence import Silence
from epp.observability import collectors
from epp.observability.logs import Throttle

log = logging.getLogger("epp.kvcache")

_YIELD_EVERY: Final = 64  # replayed or held batches applied between yields to the loop
_POLL_SLICE_MS: Final = 50  # replay waits in slices, so an overflowing hold buffer ends it at once
END_SEQ: Final = b"\xff" * 8
Outcome = Literal["ok", "partial", "failed"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("ok", "partial", "failed")


@dataclasses.dataclass(frozen=True, slots=True)
class FeedSpec:
    """One pod's KV-event source."""

    pod: str  # index pod id (the datastore endpoint name; rank-qualified)
    # Base model the pod serves, the seed of block keys ("" = unknown; a `kv@<ip:port>@<model>`
    # topic then supplies it).
    model: str
    events: str | None  # "tcp://host:port" publisher to connect a SUB socket to; None = only via bind mode
    replay: str | None = None  # "tcp://host:port" of the pod's replay ROUTER (a DEALER talks to it)
    hostport: str = ""  # the pod's serving "ip:port": bind mode maps topic kv@<ip:port>@<model> to the pod
    rank: int = 0  # data-parallel rank; bind mode also matches the batch's data_parallel_rank


@dataclasses.dataclass(frozen=True, slots=True)
class FeedStatus:
    """A pod's ingestion health, for status pages and tests."""

    # Connect mode: the SUB has a live ZMTP connection (socket monitor). Bind mode (no socket of
    # its own): a message from the pod has arrived since it was configured.
    connected: bool
    last_seq: int | None  # of the last applied batch; None before the first or after a purge
    batches: int
    blocks_stored: int
    blocks_removed: int
    gaps: int
    replays_ok: int
    replays_partial: int
    replays_failed: int
    resets: int
    decode_errors: int  # messages rejected (frames, sequence frame, payload, replay reply) or failed
    invalid_events: int  # events dropped from otherwise decodable batches
    held: int  # live messages waiting for a replay to finish
    last_event_age_s: float  # since the last applied batch; inf if none
    # Batches at or below the applied sequence (a replay's overlap): dropped.
    out_of_order: int = 0
    held_bytes: int = 0  # payload bytes of `held`


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """What every feed of an ingester shares; see `KVEventIngester`'s arguments."""

    default_block_size: int | None = None
    replay_timeout: float = 5.0
    replay_cooldown: float = 30.0
    hold_limit: int = 10_000
    log_interval: float = 10.0
    max_message_bytes: int = 16 << 20  # ZMQ_MAXMSGSIZE of every socket (replay DEALERs too)


class HoldBudget:
    """Payload bytes held over all pods while their replays run: one flood of large batches
    must not grow memory without bound (`hold_limit` alone counts messages)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


# A held message: (seq, batch, model, payload bytes). A plain tuple: built per held message only.
Held = tuple[int, events.EventBatch, str, int]


class Limiter:
    """A pod's dropped-message warnings, at most once per interval (`logs.Throttle`)."""

    __slots__ = ("_throttle",)

    def __init__(self, interval: float) -> None:
        self._throttle = Throttle(interval)

    def warn(self, pod: str, reason: str, detail: str) -> None:
        self._throttle.log(
            log, logging.WARNING, "kv events: pod=%s dropped a message (%s): %s", pod or "?", reason, detail
        )


class Feed:
    """One pod: its sequence state, held messages, replay task and counters. The ingester sets
    `ctx` (for replay DEALERs) and owns `sock`, `monitor` and `task`."""

    def __init__(
        self,
        spec: FeedSpec,
        index: BlockIndex,
        settings: Settings,
        replay_slots: asyncio.Semaphore,
        budget: HoldBudget | None = None,
    ) -> None:
        self.spec = spec
        self.pod = spec.pod
        self._index = index
        self._settings = settings
        self._replay_slots = replay_slots
        self._budget = budget if budget is not None else HoldBudget(1 << 62)
        self._held_bytes = 0  # this pod's share of the budget
        self.ctx: zmq.asyncio.Context | None = None
        self.sock: zmq.asyncio.Socket | None = None
        self.monitor: zmq.asyncio.Socket | None = None
        self.task: asyncio.Task[None] | None = None
        # Stops the event loop watching the sockets (epp.kvcache.ingest): called before they close.
        self.unwatch: Callable[[], None] | None = None
        self.replay_task: asyncio.Task[None] | None = None
        self.connected = False
        self.last_seq: int | None = None
        # Live copies of replayed batches are duplicates, not a restart: while the held messages
        # are drained, those from the replay's start on; afterwards, those the SUB still had
        # queued (after the last live one read). Skipped until a newer message arrives.
        self._dup_floor: int | None = None
        self._last_live = -1  # seq of the last live message read
        self._fresh = False  # the connection was lost: the next live message starts a new sequence
        # A new sequence began while a replay ran: the replay is abandoned and `_held[0]` (its
        # first message) is handled as a first one.
        self._renewed = False
        self._busy = False  # a replay is under way: live messages go to `_held`
        self._held: collections.deque[Held] = collections.deque()
        self._overflow = False
        self._cooldown_until = -math.inf
        self._last_event = -math.inf
        self.limiter = Limiter(settings.log_interval)
        # INFO lines by kind, each at most one per interval: the sequence's news (gaps, restarts),
        # replay outcomes, and the connection's state (epp.kvcache.ingest).
        self._notes = {kind: Throttle(settings.log_interval) for kind in ("sequence", "replay", "connection")}
        # Plain ints, exported at scrape time (epp.observability.collectors.KVCollector).
        self._batches = self._stored = self._removed = self._gaps = self._resets = 0
        self._rejected = 0
        self._errors: dict[str, int] = {}  # reason -> messages (events for invalid_event)
        self._replays: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        # llm-d's subscriber series: messages received, connections after the first, ZMQ failures.
        self.messages = 0
        self.connections = 0
        self.zmq_errors: dict[str, int] = {}  # operation (llm-d's names) -> failures
        self.silence = Silence()

    def stop_replay(self) -> asyncio.Task[None] | None:
        """Cancel the replay under way (the ingester awaits the task); drop held messages."""
        task, self.replay_task = self.replay_task, None
        if task is not None:
            task.cancel()
        self._busy = self._renewed = False
        self._clear_held()
        return task

    def disconnected(self) -> None:
        """The SUB lost its connection (socket monitor): the publisher may have restarted."""
        self._fresh = True

    def reconnected(self) -> None:
        """The SUB connected again after losing its connection: purge now rather than at the
        next message. A restarted publisher sends nothing until its engine next runs a step, and
        until then the old process's blocks would keep attracting requests to a cold pod (seen
        against a real vLLM)."""
        self._purge_if_lost("reconnected")

    def came_back(self) -> None:
        """The pod serves again after its scrapes failed (KVEventIngester.pod_back). If the SUB
        lost its connection meanwhile, purge now, as `reconnected` would: the SUB may connect
        seconds later (libzmq's backoff), and requests routed meanwhile would go to a cold pod
        for prefixes it no longer holds."""
        self._purge_if_lost("is back in rotation")

    def _purge_if_lost(self, news: str) -> None:
        # A replay under way is left to the next message, which abandons it (purging under it
        # would let it re-apply the old process's batches). After a purge `last_seq` is None, so
        # the second of `came_back` and `reconnected` finds nothing to do.
        if self._fresh and not self._busy and self.last_seq is not None:
            self.note(
                "sequence",
                "kv events: pod=%s %s after a disconnection (the publisher may have restarted): purged",
                self.pod,
                news,
            )
            self._purge()

    # --- live messages --------------------------------------------------------------------------

    def live(self, seq: int, batch: events.EventBatch, model: str, size: int = 0) -> None:
        """A decoded live message from the pod (`size`: its payload's bytes, for the hold budget)."""
        previous, self._last_live = self._last_live, seq
        if seq <= previous or self._fresh:
            self._fresh = False
            if previous >= 0 and self._new_sequence(previous, seq, batch, model, size):
                return
        elif self._busy:
            if len(self._held) >= self._settings.hold_limit or not self._hold((seq, batch, model, size)):
                self._overflow = True  # the replay gives up; what is lost now shows as a gap
            return
        start = self._advance(seq, batch, model, may_join=True)
        if start is not None:
            self._busy = True
            self._hold((seq, batch, model, size), force=True)
            self.replay_task = tasks.create_guarded_task(
                self._replay(start), name=f"kv-replay {self.pod}", logger=log, eternal=False
            )

    def _new_sequence(self, previous: int, seq: int, batch: events.EventBatch, model: str, size: int) -> bool:
        """A restart (seq went back) or the first message after a reconnection: purge. True if the
        message was held, as the first of the new sequence, for the replay under way to abandon."""
        if seq <= previous:
            self._resets += 1
            self.note(
                "sequence",
                "kv events: pod=%s seq went back %d -> %d (restart): purged",
                self.pod,
                previous,
                seq,
            )
        else:
            self.note(
                "sequence",
                "kv events: pod=%s reconnected at seq %d (was %d): purged",
                self.pod,
                seq,
                previous,
            )
        self._purge()
        if not self._busy:
            return False
        # The replay and the held messages belong to the old sequence.
        self._clear_held()
        self._hold((seq, batch, model, size), force=True)
        self._overflow = False
        self._renewed = True
        return True

    def _hold(self, held: Held, *, force: bool = False) -> bool:
        """Hold a live message if the budget allows (`force`: the one that starts a replay)."""
        size = held[3]
        if not force and self._budget.used + size > self._budget.limit:
            return False
        self._held.append(held)
        self._held_bytes += size
        self._budget.used += size
        return True

    def _unhold(self, size: int) -> None:
        self._held_bytes -= size
        self._budget.used -= size

    def _clear_held(self) -> None:
        self._held.clear()
        self._budget.used -= self._held_bytes
        self._held_bytes = 0

    def note(self, kind: str, msg: str, *args: object) -> None:
        """An INFO line of one `kind`, at most one per `log_interval` (see the module doc)."""
        self._notes[kind].log(log, logging.INFO, msg, *args)

    def _skip(self) -> None:
        """A batch at or below what was applied (a replay's overlap): dropped, and counted."""
        self._errors["out_of_order"] = self._errors.get("out_of_order", 0) + 1

    def reject(self, reason: str, detail: str) -> None:
        """Count and (rate-limited) log a message that cannot be used."""
        self._rejected += 1
        self._errors[reason] = self._errors.get(reason, 0) + 1
        self.limiter.warn(self.pod, reason, detail)

    def _advance(self, seq: int, batch: events.EventBatch, model: str, *, may_join: bool) -> int | None:
        """Apply the batch if `seq` continues the sequence, else handle the gap or restart.
        Returns the seq to replay from when a replay must come first (nothing applied then)."""
        last = self.last_seq
        if last is not None:
            if seq == last + 1:  # the common case first
                self._dup_floor = None
                self._apply(seq, batch, model)
                return None
            if seq <= last:
                if self._dup_floor is not None and seq >= self._dup_floor:
                    self._skip()
                    return None
                self._resets += 1
                self.note(
                    "sequence",
                    "kv events: pod=%s seq went back %d -> %d (restart): purged",
                    self.pod,
                    last,
                    seq,
                )
                self._purge()
                last = None
        self._dup_floor = None
        if last is None:
            if seq > 0 and may_join and self._can_replay():
                return 0
        else:
            self._gaps += 1
            if self._can_replay():
                return last + 1
            self.note(
                "sequence", "kv events: pod=%s gap %d -> %d without replay: purged", self.pod, last, seq
            )
            self._purge()
        self._apply(seq, batch, model)
        return None

    def _can_replay(self) -> bool:
        return self.spec.replay is not None and time.monotonic() >= self._cooldown_until

    def _apply(self, seq: int, batch: events.EventBatch, model: str) -> None:
        try:
            st = self._index.apply(
                self.pod, batch, model=model, default_block_size=self._settings.default_block_size
            )
        except Exception:
            # A bug, not bad input (apply does not raise on event content). The pod's entries may
            # be half updated: purge them rather than trust them.
            log.exception("kv events: pod=%s apply failed: purged", self.pod)
            self._rejected += 1
            self._errors["apply"] = self._errors.get("apply", 0) + 1
            self._purge()
            return
        self.last_seq = seq
        self._last_event = time.monotonic()
        self._batches += 1
        self._stored += st.stored
        self._removed += st.removed
        if batch.invalid:
            self._errors["invalid_event"] = self._errors.get("invalid_event", 0) + batch.invalid
            self.limiter.warn(self.pod, "invalid_event", batch.invalid_reason or "")

    def _purge(self) -> None:
        self._index.remove_pod(self.pod)
        self.last_seq = self._dup_floor = None

    # --- replay ---------------------------------------------------------------------------------

    async def _replay(self, start: int | None) -> None:
        """Replay from `start`, then apply the held messages; again while they show a new gap."""
        try:
            while start is not None:
                async with self._replay_slots:
                    outcome = None if self._renewed else await self._replay_once(start)
                if outcome is not None:
                    self._replays[outcome] += 1
                    if outcome == "failed":
                        self._purge()
                        self._cooldown_until = time.monotonic() + self._settings.replay_cooldown
                self.note(
                    "replay",
                    "kv events: pod=%s replay from %d: %s (at seq %s, %d held)",
                    self.pod,
                    start,
                    outcome or "abandoned (new sequence)",
                    self.last_seq,
                    len(self._held),
                )
                self._overflow = False
                start = await self._drain_held()
        except Exception:
            log.exception("kv events: pod=%s replay crashed: purged", self.pod)
            self._purge()
            self._clear_held()
        last = self.last_seq
        # A restart's small sequence numbers stay below this floor (they would come after the
        # last live message read), so it does not hide a restart.
        self._dup_floor = self._last_live + 1 if last is not None and self._last_live < last else None
        self._busy = self._renewed = False
        self.replay_task = None

    async def _drain_held(self) -> int | None:
        """Apply the held messages in order; the seq to replay from if they show a gap (or, for
        the first message of a new sequence, a join)."""
        n = 0
        while self._held:
            join, self._renewed = self._renewed, False
            seq, batch, model, size = held = self._held.popleft()
            start = self._advance(seq, batch, model, may_join=join)
            if start is not None:
                self._held.appendleft(held)
                return start
            self._unhold(size)
            n += 1
            if n % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # live messages keep going to `_held` meanwhile
        return None

    async def _replay_once(self, start: int) -> Outcome | None:
        """Ask the pod's ROUTER for everything from `start` and apply it in order. None: abandoned
        for a new sequence (restart or reconnection) seen meanwhile."""
        assert self.ctx is not None and self.spec.replay is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self._settings.max_message_bytes)
        sock: zmq.Socket[bytes] = zmq.Socket.shadow(dealer.underlying)  # plain, future-free receives
        outcome: Outcome = "ok"
        expected = start
        applied = 0
        # Legacy replies carry no topic: the model of the live message that led here.
        fallback_model = self._held[0][2] if self._held else self.spec.model
        try:
            dealer.connect(self.spec.replay)
            # Queued until the connection is up (a connecting DEALER has its pipe at once).
            sock.send_multipart((b"", start.to_bytes(8, "big")), zmq.NOBLOCK)
            deadline = time.monotonic() + self._settings.replay_timeout
            while True:
                # Short waits, so an overflowing hold buffer or a new sequence ends it at once.
                if self._renewed:
                    return None
                if self._overflow or time.monotonic() >= deadline:
                    return "failed"
                if not await dealer.poll(_POLL_SLICE_MS):
                    continue
                deadline = time.monotonic() + self._settings.replay_timeout
                while not (self._overflow or self._renewed):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if frames and not frames[0]:
                        frames = frames[1:]  # the delimiter
                    if len(frames) not in (2, 3):
                        self.reject("replay_frames", f"replay reply of {len(frames)} frames")
                        continue
                    seq_frame, payload = frames[-2], frames[-1]
                    if seq_frame == END_SEQ or not payload:
                        held = self._held
                        if self.last_seq is not None and held and held[0][0] > self.last_seq + 1:
                            self._purge()  # the replay stopped short of what is held: the rest is gone
                            outcome = "partial"
                        return outcome
                    if len(seq_frame) != 8:
                        self.reject("replay_frames", f"sequence frame of {len(seq_frame)} bytes")
                        continue
                    seq = int.from_bytes(seq_frame, "big")
                    if seq < expected:
                        self._skip()
                        continue
                    try:
                        batch = events.decode_batch(payload)
                    except events.EventDecodeError as exc:
                        self.reject("decode", f"replayed seq {seq}: {exc}")
                        continue  # its seq becomes a hole
                    if seq > expected and self.last_seq is not None:
                        # The publisher no longer has [expected, seq): forget what those could
                        # have removed, keep what follows.
                        self._purge()
                        outcome = "partial"
                    model = self.spec.model or (_topic_model(frames[0]) if len(frames) == 3 else "")
                    self._apply(seq, batch, model or fallback_model)
                    expected = seq + 1
                    applied += 1
                    if applied % _YIELD_EVERY == 0:
                        await asyncio.sleep(0)
        except zmq.ZMQError as exc:
            log.warning("kv events: pod=%s replay from %s failed: %s", self.pod, self.spec.replay, exc)
            return "failed"
        finally:
            if self.last_seq is not None:
                self._dup_floor = start
            dealer.close(linger=0)

    # --- status ---------------------------------------------------------------------------------

    def status(self, now: float) -> FeedStatus:
        """Health at monotonic time `now`."""
        return FeedStatus(
            connected=self.connected,
            last_seq=self.last_seq,
            batches=self._batches,
            blocks_stored=self._stored,
            blocks_removed=self._removed,
            gaps=self._gaps,
            replays_ok=self._replays["ok"],
            replays_partial=self._replays["partial"],
            replays_failed=self._replays["failed"],
            resets=self._resets,
            decode_errors=self._rejected,
            invalid_events=self._errors.get("invalid_event", 0),
            held=len(self._held),
            last_event_age_s=now - self._last_event,
            out_of_order=self._errors.get("out_of_order", 0),
            held_bytes=self._held_bytes,
        )

    def counts(self, now: float) -> collectors.KVPodCounts:
        """The pod's counters for the metrics exposition."""
        return collectors.KVPodCounts(
            self._batches,
            self._stored,
            self._removed,
            self._gaps,
            self._resets,
            dict(self._replays),
            dict(self._errors),
            now - self._last_event,
            messages=self.messages,
            reconnections=max(0, self.connections - 1),
            zmq_errors={**self.zmq_errors, "replay-incomplete": self._replays["failed"]},
            silent=self.silence.silent,
        )

    @property
    def published(self) -> bool:
        """Whether a batch from the pod has been applied since it was configured."""
        return self._last_event > -math.inf


def parse_topic(topic: bytes) -> tuple[str, str]:
    """(address, model) of a `kv@<address>@<model>` topic; ("", "") for other topics."""
    parts = topic.decode("utf-8", "replace").split("@", 2)
    if parts[0] != "kv" or len(parts) < 2:
        return "", ""
    return parts[1], parts[2] if len(parts) == 3 else ""


def _topic_model(topic: bytes) -> str:
    return parse_topic(topic)[1]
