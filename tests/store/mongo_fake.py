"""An in-process fake of the part of ``pymongo.AsyncMongoClient`` that ``store.mongo`` uses.

Async wrappers over mongomock's synchronous collections (mongomock evaluates the filters, update
operators, indexes and aggregation stages), with cursors that have ``sort``/``limit``/``to_list``,
``bulk_write`` re-implemented on top of single-document operations (mongomock's own does not
accept PyMongo 4.20's operation objects), a log of every filter and sort the store sends (to check
each against the declared indexes), and injectable driver errors. Each call yields to the event
loop once before it runs, so concurrent tasks interleave between operations the way they would
between round trips; each single-document operation is atomic, as on a server.

Returned documents carry aware UTC datetimes, as a real client created with ``tz_aware=True,
tzinfo=UTC`` does. A duplicate key on insert raises the server's error shape (``errmsg`` naming
the index, ``keyPattern``, ``keyValue``), which mongomock's bare error lacks; creating an index is
a no-op when it exists, and a partial unique index checks only the documents its filter selects
(mongomock checks every document).

What this fake CANNOT prove — only a real replica set can:

- write concerns and journaling: it records the write concern the store asks for, but nothing is
  replicated or journaled, so "acknowledged after a majority, journaled write" is untested here;
- index use: mongomock scans every document; that no query needs a collection scan is checked
  only by comparing the store's filters and sorts with the declared index keys (no query planner);
- transactions and atomicity across documents, and the interleavings of real concurrent clients
  (only interleavings at operation boundaries in one event loop are exercised);
- that the server lets exactly one of concurrent replays without force in
  (``executions_first_replay_of``, a partial unique index): the fake refuses a second key as the
  server does, and concurrent dispatches in one event loop interleave between the store's
  check of the run's replays and its insert, so there the index is what refuses the losers;
  but uniqueness under real concurrent inserts from several clients, and during an index build
  on a collection in use, is the server's to show (the ``mongo`` backend of the contract suite);
- retryable writes, failover, elections, ``NotPrimaryError`` recovery: errors are injected, never
  produced by a server;
- which server versions support an operator: mongomock implements its own subset of the query and
  aggregation languages, which is neither a superset nor a subset of any MongoDB release.

Where mongomock is more lenient than a server in a way this store depends on, the fake is made as
strict as the server: partial-index filters (the server's operator whitelist), index conflicts
under one name (``IndexOptionsConflict`` 85, ``IndexKeySpecsConflict`` 86, with the server's
codes), and values BSON cannot hold (mongomock encodes every document, so an integer beyond
64 bits or NUL in a key raises as the driver does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import bson
import mongomock
from mongomock import filtering as mongomock_filtering
from pymongo import (
    DeleteMany,
    DeleteOne,
    IndexModel,
    InsertOne,
    ReplaceOne,
    ReturnDocument,
    UpdateMany,
    UpdateOne,
)
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure
from pymongo.results import (
    BulkWriteResult,
    DeleteResult,
    InsertManyResult,
    InsertOneResult,
    UpdateResult,
)
from pymongo.write_concern import WriteConcern

Document = dict[str, Any]
ID_FIELD = "_id"


@dataclass(frozen=True)
class Query:
    """One filter the store sent: for a check against the indexes."""

    collection: str
    op: str
    filter: Mapping[str, Any]
    sort: tuple[tuple[str, int], ...] = ()


@dataclass
class _Fault:
    error: BaseException
    op: str | None
    times: int
    skip: int


@dataclass
class _Shared:
    queries: list[Query] = field(default_factory=list)
    faults: list[_Fault] = field(default_factory=list)
    calls: int = 0

    def check(self, op: str) -> None:
        self.calls += 1
        for fault in self.faults:
            if fault.op is None or fault.op == op:
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                raise fault.error


_matches: Any = mongomock_filtering.filter_applies
"""``_matches(filter, document)``: whether a document satisfies a query filter (mongomock's)."""


def _utc(value: Any) -> Any:
    """``value`` with every datetime as an aware UTC datetime (as ``tzinfo=UTC`` codec options)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, dict):
        return {k: _utc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utc(v) for v in value]
    return value


class FakeCursor:
    """``AsyncCursor`` / ``AsyncCommandCursor`` subset: ``sort``, ``skip``, ``limit``,
    ``to_list``."""

    def __init__(
        self,
        shared: _Shared,
        collection: str,
        fetch: Any,
        filter: Mapping[str, Any] | None = None,
    ) -> None:
        self._shared = shared
        self._collection = collection
        self._fetch = fetch
        self._filter = filter
        self._sort: list[tuple[str, int]] = []
        self._skip = 0
        self._limit = 0

    def sort(self, key_or_list: str | Sequence[tuple[str, int]], direction: int = 1) -> FakeCursor:
        if isinstance(key_or_list, str):
            self._sort = [(key_or_list, direction)]
        else:
            self._sort = list(key_or_list)
        return self

    def skip(self, skip: int) -> FakeCursor:
        self._skip = skip
        return self

    def limit(self, limit: int) -> FakeCursor:
        self._limit = limit
        return self

    async def to_list(self, length: int | None = None) -> list[Document]:
        await asyncio.sleep(0)
        self._shared.check("find")
        if self._filter is not None:
            self._shared.queries.append(
                Query(self._collection, "find", self._filter, tuple(self._sort))
            )
        docs = list(self._fetch(self._sort, self._skip, self._limit))
        if length is not None:
            docs = docs[:length]
        return [_utc(d) for d in docs]


class FakeAsyncCollection:
    """``AsyncCollection`` subset used by the store and the dashboard tests."""

    def __init__(self, shared: _Shared, sync: Any) -> None:
        self._shared = shared
        self._c = sync
        self.name: str = sync.name

    async def _enter(self, op: str) -> None:
        await asyncio.sleep(0)
        self._shared.check(op)

    def _log(self, op: str, filter: Mapping[str, Any]) -> None:
        self._shared.queries.append(Query(self.name, op, filter))

    async def create_indexes(self, models: Iterable[IndexModel]) -> list[str]:
        """As the server's ``createIndexes``: idempotent for an identical index; an index of the
        same name with other keys (``IndexKeySpecsConflict``) or options
        (``IndexOptionsConflict``), or of the same keys and options under another name, fails
        as the server fails; a partial filter the server refuses (:func:`partial_filter_error`)
        fails with ``CannotCreateIndex``."""
        await self._enter("create_indexes")
        names = []
        for model in models:
            doc = dict(model.document)
            keys = list(doc.pop("key").items())
            name = doc["name"]
            options = {k: v for k, v in doc.items() if k != "name"}
            partial = doc.get("partialFilterExpression")
            if partial is not None and (problem := partial_filter_error(partial)) is not None:
                raise _failure(
                    67,
                    "CannotCreateIndex",
                    f"Error in specification {doc} :: caused by :: {problem}",
                )
            existing = self._c.index_information()
            if name in existing:
                current = {k: v for k, v in existing[name].items() if k not in ("v", "key")}
                if [tuple(k) for k in existing[name]["key"]] != [tuple(k) for k in keys]:
                    raise _failure(
                        86,
                        "IndexKeySpecsConflict",
                        f"An existing index has the same name as the requested index but different keys. Requested index: {doc}, existing index: {existing[name]}",
                    )
                if current != options:
                    raise _failure(
                        85,
                        "IndexOptionsConflict",
                        f"An equivalent index already exists with the same name but different options. Requested index: {doc}, existing index: {existing[name]}",
                    )
                names.append(name)
                continue
            for other, info in existing.items():
                same_keys = [tuple(k) for k in info["key"]] == [tuple(k) for k in keys]
                same_options = {k: v for k, v in info.items() if k not in ("v", "key")} == options
                if same_keys and same_options:
                    raise _failure(
                        85,
                        "IndexOptionsConflict",
                        f"Index already exists with a different name: {other}",
                    )
            if doc.get("unique") and partial is not None:
                self._check_unique([k for k, _ in keys], partial)
                doc.pop("unique")
                names.append(self._c.create_index(keys, **doc))
                self._c._store.indexes[name]["unique"] = True  # past mongomock's full check
            else:
                names.append(self._c.create_index(keys, **doc))
        return names

    def _check_unique(self, keys: list[str], partial: Mapping[str, Any]) -> None:
        seen: set[str] = set()
        for d in self._c.find(partial):
            value = repr([d.get(k) for k in keys])
            if value in seen:
                raise DuplicateKeyError(f"E11000 duplicate key error: {value}", 11000)
            seen.add(value)

    def _duplicate(
        self, document: Mapping[str, Any], *, updated: bool = False
    ) -> DuplicateKeyError:
        """The error a server raises for inserting ``document`` over an existing one (or for
        an update that made a stored document ``document``: others than it count)."""
        for name, info in self._c.index_information().items():
            if name != "_id_" and not info.get("unique"):
                continue
            partial = info.get("partialFilterExpression") or {}
            if partial and not _matches(partial, document):
                continue
            value = {k: document.get(k) for k, _ in info["key"]}
            others = {ID_FIELD: {"$ne": document[ID_FIELD]}} if updated else {}
            if self._c.count_documents({"$and": [partial, value, others]}) == 0:
                continue
            message = (
                f"E11000 duplicate key error collection: {self._c.full_name} index: {name} "
                f"dup key: {value}"
            )
            details = {
                "index": 0,
                "code": 11000,
                "errmsg": message,
                "keyPattern": dict(info["key"]),
                "keyValue": value,
            }
            return DuplicateKeyError(message, 11000, details)
        return DuplicateKeyError("E11000 duplicate key error", 11000)  # pragma: no cover

    async def index_information(self) -> dict[str, Any]:
        await self._enter("index_information")
        return dict(self._c.index_information())

    async def insert_one(self, document: Document) -> InsertOneResult:
        await self._enter("insert_one")
        _encode(document)
        return self._insert(document)

    def _insert(self, document: Document) -> InsertOneResult:
        try:
            result: InsertOneResult = self._c.insert_one(dict(document))
        except DuplicateKeyError:
            raise self._duplicate(document) from None
        return result

    async def insert_many(self, documents: Iterable[Document], ordered: bool = True) -> Any:
        await self._enter("insert_many")
        result = self._bulk([InsertOne(dict(d)) for d in documents], ordered=ordered)
        return InsertManyResult([], result.acknowledged)

    async def find_one(
        self, filter: Mapping[str, Any], projection: Mapping[str, Any] | None = None
    ) -> Document | None:
        await self._enter("find_one")
        self._log("find_one", filter)
        doc: Document | None = _utc(self._c.find_one(filter, projection))
        return doc

    def find(
        self, filter: Mapping[str, Any], projection: Mapping[str, Any] | None = None
    ) -> FakeCursor:
        def fetch(sort: list[tuple[str, int]], skip: int, limit: int) -> Any:
            cursor = self._c.find(filter, projection)
            if sort:
                cursor = cursor.sort(sort)
            if skip:
                cursor = cursor.skip(skip)
            return cursor.limit(limit) if limit else cursor

        return FakeCursor(self._shared, self.name, fetch, filter)

    async def aggregate(self, pipeline: Sequence[Mapping[str, Any]]) -> FakeCursor:
        await self._enter("aggregate")
        stages = list(pipeline)
        if stages and "$match" in stages[0]:
            sort = stages[1].get("$sort", {}) if len(stages) > 1 else {}
            self._shared.queries.append(
                Query(self.name, "aggregate", stages[0]["$match"], tuple(sort.items()))
            )
        docs = list(self._c.aggregate(stages))
        return FakeCursor(self._shared, self.name, lambda _sort, _skip, _limit: docs)

    async def find_one_and_update(
        self,
        filter: Mapping[str, Any],
        update: Mapping[str, Any],
        projection: Mapping[str, Any] | None = None,
        return_document: bool = ReturnDocument.BEFORE,
    ) -> Document | None:
        await self._enter("find_one_and_update")
        _encode(filter, update)
        self._log("find_one_and_update", filter)
        try:
            doc: Document | None = _utc(
                self._c.find_one_and_update(
                    filter, update, projection=projection, return_document=return_document
                )
            )
        except DuplicateKeyError:
            raise self._duplicate(self._updated(filter, update), updated=True) from None
        return doc

    def _updated(self, filter: Mapping[str, Any], update: Mapping[str, Any]) -> Document:
        """The document ``update`` would make of the one ``filter`` selects (for the error a
        server raises when the result breaks a unique index)."""
        scratch: Any = mongomock.MongoClient().db.scratch
        scratch.insert_one(self._c.find_one(filter))
        scratch.update_one({}, update)
        result: Document = scratch.find_one({})
        return result

    async def update_one(
        self, filter: Mapping[str, Any], update: Mapping[str, Any], upsert: bool = False
    ) -> UpdateResult:
        await self._enter("update_one")
        _encode(filter, update)
        self._log("update_one", filter)
        result: UpdateResult = self._c.update_one(filter, update, upsert=upsert)
        return result

    async def delete_one(self, filter: Mapping[str, Any]) -> DeleteResult:
        await self._enter("delete_one")
        self._log("delete_one", filter)
        result: DeleteResult = self._c.delete_one(filter)
        return result

    async def delete_many(self, filter: Mapping[str, Any]) -> DeleteResult:
        await self._enter("delete_many")
        self._log("delete_many", filter)
        result: DeleteResult = self._c.delete_many(filter)
        return result

    async def count_documents(self, filter: Mapping[str, Any]) -> int:
        await self._enter("count_documents")
        count: int = self._c.count_documents(filter)
        return count

    async def bulk_write(self, requests: Sequence[Any], ordered: bool = True) -> BulkWriteResult:
        await self._enter("bulk_write")
        return self._bulk(requests, ordered=ordered)

    def _bulk(self, requests: Sequence[Any], *, ordered: bool) -> BulkWriteResult:
        """Run the operations one by one, with PyMongo's result and error shapes. Every
        operation is encoded first, as the driver encodes a batch before it sends it: one that
        BSON cannot hold fails the call with nothing applied."""
        for op in requests:
            _encode(*(d for d in (getattr(op, "_filter", None), getattr(op, "_doc", None)) if d))
        details: Document = {
            "writeErrors": [],
            "writeConcernErrors": [],
            "nInserted": 0,
            "nUpserted": 0,
            "nMatched": 0,
            "nModified": 0,
            "nRemoved": 0,
            "upserted": [],
        }
        for index, op in enumerate(requests):
            try:
                self._apply(index, op, details)
            except DuplicateKeyError as e:
                details["writeErrors"].append(
                    {"index": index, "code": 11000, "errmsg": str(e), "op": _op_doc(op)}
                )
                if ordered:
                    break
        if details["writeErrors"]:
            raise BulkWriteError(details)
        return BulkWriteResult(details, True)

    def _apply(self, index: int, op: Any, details: Document) -> None:
        if isinstance(op, InsertOne):
            self._insert(op._doc)
            details["nInserted"] += 1
        elif isinstance(op, UpdateOne | UpdateMany | ReplaceOne):
            self._log("bulk_write", op._filter)
            upsert = bool(op._upsert)
            if isinstance(op, UpdateOne):
                r = self._c.update_one(op._filter, op._doc, upsert=upsert)
            elif isinstance(op, UpdateMany):
                r = self._c.update_many(op._filter, op._doc, upsert=upsert)
            else:
                r = self._c.replace_one(op._filter, op._doc, upsert=upsert)
            if r.upserted_id is not None:
                details["nUpserted"] += 1
                details["upserted"].append({"index": index, "_id": r.upserted_id})
            else:
                details["nMatched"] += r.matched_count
                details["nModified"] += r.modified_count
        elif isinstance(op, DeleteOne | DeleteMany):
            self._log("bulk_write", op._filter)
            if isinstance(op, DeleteOne):
                details["nRemoved"] += self._c.delete_one(op._filter).deleted_count
            else:
                details["nRemoved"] += self._c.delete_many(op._filter).deleted_count
        else:  # pragma: no cover - the store uses no other operation
            raise OperationFailure(f"fake bulk_write: unsupported operation {op!r}")


PARTIAL_FILTER_OPERATORS = frozenset(
    {"$eq", "$gt", "$gte", "$lt", "$lte", "$type", "$exists", "$in"}
)
PARTIAL_FILTER_MAX_DEPTH = 4


def partial_filter_error(expr: Mapping[str, Any], level: int = 0) -> str | None:
    """Why the server would refuse ``expr`` as a ``partialFilterExpression``, or None.

    MongoDB 6.0 and later (``IndexCatalogImpl::_checkValidFilterExpressions``) accept only
    equality (``field: value``, ``$eq``), ``$exists: true``, ``$gt``/``$gte``/``$lt``/``$lte``,
    ``$type``, ``$in``, and ``$and``/``$or`` of those, nested at most four levels; ``$ne``,
    ``$nin``, ``$not``, ``$exists: false`` (a negation), ``$regex``, ``$elemMatch``, ``$expr`` and
    the rest are refused. mongomock accepts every filter, so an index only a real server rejects
    would pass this suite and fail at the first start in production.
    """
    if level + 1 > PARTIAL_FILTER_MAX_DEPTH:
        return f"partialFilterExpression depth may not exceed {PARTIAL_FILTER_MAX_DEPTH}"
    for key, value in expr.items():
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                return f"{key} must be a nonempty array"
            for clause in value:
                if (problem := partial_filter_error(clause, level + 1)) is not None:
                    return problem
            continue
        if key.startswith("$"):
            return f"Expression not supported in partial index: {key}"
        if isinstance(value, Mapping) and any(str(k).startswith("$") for k in value):
            for op, arg in value.items():
                if op not in PARTIAL_FILTER_OPERATORS:
                    negation = op in ("$ne", "$nin", "$not")
                    return (
                        f"Expression not supported in partial index: {'$not' if negation else op}"
                    )
                if op == "$exists" and not arg:
                    return "Expression not supported in partial index: $not (exists: false)"
    return None


def _failure(code: int, name: str, message: str) -> OperationFailure:
    """An ``OperationFailure`` shaped as the server's reply (``code``, ``codeName``, ``errmsg``)."""
    return OperationFailure(
        message, code, {"ok": 0.0, "errmsg": message, "code": code, "codeName": name}
    )


def _encode(*documents: Mapping[str, Any]) -> None:
    """Raise what the driver raises for a document BSON cannot hold (``InvalidDocument``,
    ``OverflowError``, ``UnicodeEncodeError``), before anything reaches the server. mongomock
    encodes too, but only after it applied an update in place, leaving half a write behind."""
    for doc in documents:
        bson.encode(dict(doc))


def _op_doc(op: Any) -> Any:
    return getattr(op, "_doc", None) or getattr(op, "_filter", None)


class FakeAsyncDatabase:
    """``AsyncDatabase`` subset: collections by name, ``command("ping")``."""

    def __init__(
        self,
        shared: _Shared,
        sync: Any,
        *,
        codec_options: Any = None,
        write_concern: WriteConcern | None = None,
    ) -> None:
        self._shared = shared
        self._db = sync
        self.name: str = sync.name
        self.codec_options = codec_options
        self.write_concern = write_concern or WriteConcern()
        self._collections: dict[str, FakeAsyncCollection] = {}

    def __getitem__(self, name: str) -> FakeAsyncCollection:
        return self.get_collection(name)

    def get_collection(self, name: str) -> FakeAsyncCollection:
        if name not in self._collections:
            self._collections[name] = FakeAsyncCollection(self._shared, self._db[name])
        return self._collections[name]

    async def command(self, command: str) -> Document:
        await asyncio.sleep(0)
        self._shared.check("command")
        if command != "ping":  # pragma: no cover - the store sends no other command
            raise OperationFailure(f"fake: unsupported command {command!r}")
        return {"ok": 1.0}

    async def list_collection_names(self) -> list[str]:
        await asyncio.sleep(0)
        return list(self._db.list_collection_names())


class FakeAsyncMongoClient:
    """``AsyncMongoClient`` subset, on one private mongomock server.

    ``fail(error, op=…, times=…, skip=…)`` makes ``times`` calls of ``op``, after ``skip`` more
    succeeded, raise ``error``; ``op`` is one of ``find`` (cursors), ``find_one``, ``insert_one``,
    ``insert_many``, ``find_one_and_update``, ``update_one``, ``bulk_write``, ``delete_one``,
    ``delete_many``, ``aggregate``, ``command``, ``create_indexes``, or None for any. ``queries`` logs every filter (and sort) the store sent.
    """

    def __init__(self) -> None:
        self._sync: Any = mongomock.MongoClient(tz_aware=True)
        self._shared = _Shared()
        self.closed = False

    @property
    def queries(self) -> list[Query]:
        return self._shared.queries

    @property
    def calls(self) -> int:
        """How many operations the store sent so far."""
        return self._shared.calls

    def fail(
        self, error: BaseException, *, op: str | None = None, times: int = 1, skip: int = 0
    ) -> None:
        self._shared.faults.append(_Fault(error, op, times, skip))

    def get_database(
        self,
        name: str | None = None,
        codec_options: Any = None,
        read_preference: Any = None,
        write_concern: WriteConcern | None = None,
        read_concern: Any = None,
    ) -> FakeAsyncDatabase:
        return FakeAsyncDatabase(
            self._shared,
            self._sync.get_database(name or "jobsched"),
            codec_options=codec_options,
            write_concern=write_concern,
        )

    async def drop_database(self, name: str) -> None:
        await asyncio.sleep(0)
        self._sync.drop_database(name)

    async def close(self) -> None:
        self.closed = True
