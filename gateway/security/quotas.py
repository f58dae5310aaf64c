"""Per-key quotas over calendar days and months, and the usage ledger the admin API reads.

A key may have ``tokens_per_day``, ``tokens_per_month``, ``search_units_per_day`` and
``search_units_per_month``. The windows are calendar days and months in
``limits.quota_timezone`` (``zoneinfo``): a daily quota resets at local midnight, a monthly one
on the 1st, daylight-saving changes included.

Exact, not approximate: a request's tokens are only known once it is scored (the engine or the
upstream counts them), so a request is

1. refused up front (429, no work done) when one of its key's quotas is already used up, and
2. charged after scoring, before its answer is sent, by one atomic check-and-charge: if its
   usage would take any quota past its limit, nothing is charged and the request is answered
   429 instead (its work is lost, its usage is not counted).

With Redis (``limits.redis_url``) step 2 is one Lua script over every replica's counters, so
concurrent requests on any number of replicas can never take a quota past its limit; without
Redis the same check runs on this process's counters. With Redis, the windows are also judged
by Redis's clock (``TIME``, read again every :data:`CLOCK_REFRESH_S`), not each replica's: two
replicas whose clocks disagree around midnight would otherwise charge one day's quota in two
windows, letting a key through twice its limit. A Redis outage follows
``limits.redis_failure`` as rpm/tpm do: "closed" answers 503, "open" counts in this process.

Every charged request (any key, quota or not) is also added to the usage ledger: per local day,
per key and model, its requests, documents, tokens and search units (Redis hash per day, kept
:data:`USAGE_RETENTION_DAYS`; in memory without Redis). Only key ids are stored, never a key.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from time import monotonic as _monotonic  # a module global, so tests can set the clock
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo

from gateway.errors import RateLimitedError
from schemas.config import ApiKeyConfig

__all__ = (
    "USAGE_RETENTION_DAYS",
    "Calendar",
    "MemoryQuotaStore",
    "QuotaRule",
    "QuotaStatus",
    "RedisQuotaStore",
    "UsageRow",
    "quota_refusal",
    "quota_rules",
)

Metric = Literal["tokens", "search_units"]
Period = Literal["day", "month"]
_PREFIX: Final = "rerank-gateway"
USAGE_RETENTION_DAYS: Final = 400  # a year of daily usage, and the month before it
USAGE_FIELDS: Final = ("requests", "documents", "tokens", "search_units")


@dataclass(slots=True, frozen=True)
class QuotaRule:
    metric: Metric
    period: Period
    limit: int

    @property
    def name(self) -> str:  # the config field: what the 429 names
        return f"{self.metric}_per_{self.period}"


def quota_rules(key: ApiKeyConfig) -> tuple[QuotaRule, ...]:
    rules = []
    for metric in ("tokens", "search_units"):
        for period in ("day", "month"):
            limit = getattr(key, f"{metric}_per_{period}")
            if limit is not None:
                rules.append(QuotaRule(metric, period, limit))
    return tuple(rules)


class Calendar:
    """Calendar windows in one time zone; ``clock`` is injectable so tests need no waiting."""

    def __init__(self, zone: str, clock: Callable[[], datetime] | None = None) -> None:
        self.zone = ZoneInfo(zone)
        self.clock = clock or (lambda: datetime.now(UTC))  # replaceable: tests set a fixed time

    def now(self) -> datetime:
        return self.clock().astimezone(self.zone)

    def window(self, period: Period, now: datetime) -> tuple[str, datetime]:
        """The window's id (``2026-12-04`` / ``2026-12``) and when the next one starts (aware)."""
        local = now.astimezone(self.zone)
        if period == "day":
            nxt = local.date() + timedelta(days=1)
            return local.date().isoformat(), datetime(nxt.year, nxt.month, nxt.day, tzinfo=self.zone)
        year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
        return f"{local.year:04d}-{local.month:02d}", datetime(year, month, 1, tzinfo=self.zone)

    def today(self) -> date:
        return self.now().date()


@dataclass(slots=True, frozen=True)
class QuotaStatus:
    """One quota of one key now: what ``GET /admin/v1/keys/{id}/quota`` answers."""

    quota: str
    limit: int
    used: int
    remaining: int
    resets_at: str  # ISO 8601 with the zone's offset


@dataclass(slots=True, frozen=True)
class UsageRow:
    key: str
    model: str
    requests: int
    documents: int
    tokens: int
    search_units: int


def quota_refusal(
    key: ApiKeyConfig, rule: QuotaRule, used: int, cost: int, reset_at: datetime, now: datetime
) -> RateLimitedError:
    """429 naming the quota, what is left and when it resets; ``Retry-After`` until then."""
    # Timestamps: two datetimes in the same ZoneInfo subtract as local times, an hour off across DST.
    retry = max(1, math.ceil(reset_at.timestamp() - now.timestamp()))
    unit = rule.metric.replace("_", " ")
    left = max(0, rule.limit - used)
    if cost <= 0 or left == 0:
        what = f"API key '{key.id}' used its quota {rule.name} = {rule.limit} ({used} {unit} used)"
    else:
        what = (
            f"API key '{key.id}': this request needs {cost} {unit}, more than the {left} left of its "
            f"quota {rule.name} = {rule.limit}"
        )
    message = f"{what}; it resets at {reset_at.isoformat()}"
    headers = {
        "Retry-After": str(retry),
        "X-Quota-Name": rule.name,
        "X-Quota-Limit": str(rule.limit),
        "X-Quota-Remaining": str(left),
        "X-Quota-Reset": reset_at.isoformat(),
    }
    return RateLimitedError(message, headers=headers, limit=rule.name)


def _counter(key_id: str, rule: QuotaRule, window: str) -> str:
    return f"{_PREFIX}:quota:{key_id}:{rule.metric}:{rule.period}:{window}"


def _usage_hash(day: str) -> str:
    return f"{_PREFIX}:usage:{day}"


def _days(start: date, end: date) -> Iterator[date]:
    # Counted, not stepped past ``end``: a step beyond date.max (end = 9999-12-31) would raise.
    for offset in range((end - start).days + 1):
        yield start + timedelta(days=offset)


def _rows(fields: dict[str, int]) -> list[UsageRow]:
    """``key|model|field`` -> rows (key ids cannot contain '|'; model names may, so split twice)."""
    table: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for name, value in fields.items():
        key_id, _, rest = name.partition("|")
        model, _, field = rest.rpartition("|")
        table[(key_id, model)][field] = value
    return [
        UsageRow(key_id, model, *(values.get(f, 0) for f in USAGE_FIELDS))
        for (key_id, model), values in sorted(table.items())
    ]


class _Store:
    """What both stores share: windows, refusals and reading status from raw counters."""

    def __init__(self, calendar: Calendar) -> None:
        self.calendar = calendar

    def _windows(self, key: ApiKeyConfig, now: datetime) -> list[tuple[QuotaRule, str, datetime]]:
        return [(rule, *self.calendar.window(rule.period, now)) for rule in quota_rules(key)]

    @staticmethod
    def _cost(rule: QuotaRule, tokens: int, search_units: int) -> int:
        return tokens if rule.metric == "tokens" else search_units

    def _status(self, windows: list[tuple[QuotaRule, str, datetime]], used: list[int]) -> list[QuotaStatus]:
        return [
            QuotaStatus(rule.name, rule.limit, n, max(0, rule.limit - n), reset.isoformat())
            for (rule, _, reset), n in zip(windows, used, strict=True)
        ]


class MemoryQuotaStore(_Store):
    """This process's counters: without Redis, or with Redis down and ``redis_failure = "open"``."""

    def __init__(self, calendar: Calendar) -> None:
        super().__init__(calendar)
        self._used: dict[str, int] = defaultdict(int)
        self._usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    async def check(self, key: ApiKeyConfig) -> None:
        now = self.calendar.now()
        for rule, window, reset in self._windows(key, now):
            used = self._used[_counter(key.id, rule, window)]
            if used >= rule.limit:
                raise quota_refusal(key, rule, used, 0, reset, now)

    async def charge(self, key: ApiKeyConfig, model: str, *, documents: int, tokens: int, search_units: int) -> None:
        now = self.calendar.now()
        windows = self._windows(key, now)
        for rule, window, reset in windows:  # check all, then charge all: one step on one loop
            cost = self._cost(rule, tokens, search_units)
            used = self._used[_counter(key.id, rule, window)]
            if cost > 0 and used + cost > rule.limit:
                raise quota_refusal(key, rule, used, cost, reset, now)
        for rule, window, _ in windows:
            self._used[_counter(key.id, rule, window)] += self._cost(rule, tokens, search_units)
        day = now.date().isoformat()
        if day not in self._usage:  # a new day: forget those past the retention
            oldest = (now.date() - timedelta(days=USAGE_RETENTION_DAYS)).isoformat()
            for old in [d for d in self._usage if d < oldest]:
                del self._usage[old]
        ledger = self._usage[day]
        for field, value in zip(USAGE_FIELDS, (1, documents, tokens, search_units), strict=True):
            ledger[f"{key.id}|{model}|{field}"] += value

    async def status(self, key: ApiKeyConfig) -> list[QuotaStatus]:
        windows = self._windows(key, self.calendar.now())
        return self._status(windows, [self._used[_counter(key.id, r, w)] for r, w, _ in windows])

    async def usage(self, start: date, end: date) -> list[UsageRow]:
        total: dict[str, int] = defaultdict(int)
        for day in _days(start, end):
            for name, value in self._usage.get(day.isoformat(), {}).items():
                total[name] += value
        return _rows(total)


# KEYS: the quota counters, then the day's usage hash. ARGV: n counters; per counter its limit,
# cost and TTL (s); then the hash's TTL and its field/increment pairs. Returns 0 when charged,
# else the 1-based index of the first quota it would pass and that counter's value.
_CHARGE: Final = """
local n = tonumber(ARGV[1])
for i = 1, n do
    local used = tonumber(redis.call('GET', KEYS[i]) or '0')
    local cost = tonumber(ARGV[3 * i])
    if cost > 0 and used + cost > tonumber(ARGV[3 * i - 1]) then
        return {i, used}
    end
end
for i = 1, n do
    local cost = tonumber(ARGV[3 * i])
    if cost > 0 then
        redis.call('INCRBY', KEYS[i], cost)
    end
    redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3 * i + 1]))
end
local usage = KEYS[n + 1]
local at = 3 * n + 3
while at < #ARGV do
    redis.call('HINCRBY', usage, ARGV[at], tonumber(ARGV[at + 1]))
    at = at + 2
end
redis.call('EXPIRE', usage, tonumber(ARGV[3 * n + 2]))
return {0, 0}
"""


# How long a replica trusts its last reading of Redis's clock (``RedisQuotaStore._now``): the
# offset to the local clock drifts by well under a second a minute.
CLOCK_REFRESH_S: Final = 60.0


class RedisQuotaStore(_Store):
    """Counters shared by every replica, in windows of Redis's clock. Calls raise the client's
    errors (the caller maps them)."""

    def __init__(self, calendar: Calendar, client: Any) -> None:
        super().__init__(calendar)
        self._client = client
        self._charge = client.register_script(_CHARGE)
        self._offset = 0.0  # Redis's clock minus the calendar's, in seconds
        self._synced: float | None = None  # _monotonic() of the last reading

    async def _now(self) -> datetime:
        """Now by Redis's clock: the calendar's clock plus the offset read with ``TIME`` (taken at
        the middle of the round trip), read again once older than :data:`CLOCK_REFRESH_S`."""
        if self._synced is None or _monotonic() - self._synced > CLOCK_REFRESH_S:
            before = self.calendar.clock().timestamp()
            seconds, micros = await self._client.time()
            after = self.calendar.clock().timestamp()
            self._offset = seconds + micros / 1e6 - (before + after) / 2
            self._synced = _monotonic()
        shared = self.calendar.clock().timestamp() + self._offset
        return datetime.fromtimestamp(shared, UTC).astimezone(self.calendar.zone)

    async def check(self, key: ApiKeyConfig) -> None:
        if not quota_rules(key):
            return  # nothing to read: a key without quotas costs no round trip here
        now = await self._now()
        windows = self._windows(key, now)
        values = await self._client.mget([_counter(key.id, r, w) for r, w, _ in windows])
        for (rule, _, reset), value in zip(windows, values, strict=True):
            used = int(value or 0)
            if used >= rule.limit:
                raise quota_refusal(key, rule, used, 0, reset, now)

    async def charge(self, key: ApiKeyConfig, model: str, *, documents: int, tokens: int, search_units: int) -> None:
        now = await self._now()
        windows = self._windows(key, now)
        keys = [_counter(key.id, rule, window) for rule, window, _ in windows]
        args: list[Any] = [len(windows)]
        for rule, _, reset in windows:
            # Kept a day past the window's end, so a late reader still sees its final count.
            ttl = max(1, math.ceil(reset.timestamp() - now.timestamp())) + 86_400
            args += [rule.limit, self._cost(rule, tokens, search_units), ttl]
        args.append(USAGE_RETENTION_DAYS * 86_400)
        for field, value in zip(USAGE_FIELDS, (1, documents, tokens, search_units), strict=True):
            args += [f"{key.id}|{model}|{field}", value]
        refused, used = await self._charge(keys=[*keys, _usage_hash(now.date().isoformat())], args=args)
        if refused:
            rule, _, reset = windows[int(refused) - 1]
            raise quota_refusal(key, rule, int(used), self._cost(rule, tokens, search_units), reset, now)

    async def status(self, key: ApiKeyConfig) -> list[QuotaStatus]:
        if not quota_rules(key):
            return []
        windows = self._windows(key, await self._now())
        values = await self._client.mget([_counter(key.id, r, w) for r, w, _ in windows])
        return self._status(windows, [int(v or 0) for v in values])

    async def usage(self, start: date, end: date) -> list[UsageRow]:
        pipe = self._client.pipeline(transaction=False)
        for day in _days(start, end):
            pipe.hgetall(_usage_hash(day.isoformat()))
        total: dict[str, int] = defaultdict(int)
        for fields in await pipe.execute():
            for name, value in fields.items():
                total[name.decode() if isinstance(name, bytes) else name] += int(value)
        return _rows(total)
