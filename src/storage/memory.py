"""In-memory storage backends (the default, decision 11).

Placeholder without budgets: the budgeted LRU/TTL implementation replaces these classes.
"""

from __future__ import annotations

from .interface import ConversationRecord, StoredResponse, StoreLimits, StoreStatistics


class MemoryResponseStorage:
    def __init__(self, limits: StoreLimits) -> None:
        self._limits = limits
        self._entries: dict[str, StoredResponse] = {}

    def put(self, record: StoredResponse) -> None:
        if self._limits.max_entries > 0:
            self._entries[record.id] = record

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(entries=len(self._entries))


class MemoryConversationStorage:
    def __init__(self, limits: StoreLimits) -> None:
        self._limits = limits
        self._entries: dict[str, ConversationRecord] = {}

    def put(self, record: ConversationRecord) -> None:
        if self._limits.max_entries > 0:
            self._entries[record.id] = record

    def get(self, conversation_id: str) -> ConversationRecord | None:
        return self._entries.get(conversation_id)

    def delete(self, conversation_id: str) -> bool:
        return self._entries.pop(conversation_id, None) is not None

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(entries=len(self._entries))
