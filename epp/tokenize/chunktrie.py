"""The prefix-tokenization cache's store: a trie of text chunks and their token ids, least
recently used first out under a byte budget.

`epp.tokenize.prefixcache` decides where texts are cut and what ids a chunk holds; this module
only keeps the chunks. A node holds a piece of text `[start, end)` and its token ids; its children
are keyed by the first KEY_CHARS characters of their text (a list when several share a key). A
*final* node matches only a text that ends exactly at its end.

A node is always touched after its children (`touch` walks up from the deepest), so the least
recently used node is a leaf and eviction never orphans a subtree. Nothing here is thread-safe:
`PrefixCache` calls every method under its lock.
"""

from __future__ import annotations

import array
import collections

__all__ = ["KEY_CHARS", "NODE_OVERHEAD_BYTES", "ChunkTrie", "Node", "join", "shared"]

KEY_CHARS = 32  # children are keyed by this many leading characters of their text
NODE_OVERHEAD_BYTES = 250  # node object, its dict and LRU entries, array and str headers (estimate)


class Node:
    __slots__ = ("alive", "children", "end", "final", "ids", "nbytes", "parent", "text")

    def __init__(self, parent: Node | None, text: str, ids: array.array[int], end: int, final: bool) -> None:
        self.parent = parent
        self.text = text
        self.ids = ids
        self.end = end  # character offset of this chunk's end in the texts that contain it
        self.final = final  # matches only a text that ends exactly here
        self.children: dict[str, Node | list[Node]] = {}
        self.alive = True
        self.nbytes = len(text.encode("utf-8", "surrogatepass")) + 4 * len(ids) + NODE_OVERHEAD_BYTES


class ChunkTrie:
    """The chunks under `root`, their LRU order and their sizes. `cached_bytes` (estimated),
    `cached_tokens`, `nodes` and `evictions` are plain counters for metrics."""

    __slots__ = ("cached_bytes", "cached_tokens", "evictions", "lru", "max_bytes", "nodes", "root")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.root = Node(None, "", array.array("I"), 0, False)
        self.lru: collections.OrderedDict[Node, None] = collections.OrderedDict()
        self.cached_bytes = 0
        self.cached_tokens = 0
        self.nodes = 0
        self.evictions = 0

    @staticmethod
    def options(node: Node, text: str, pos: int) -> tuple[Node, ...]:
        """`node`'s children that `text` may continue with at `pos` (those keyed by its next
        KEY_CHARS characters)."""
        found = node.children.get(text[pos : pos + KEY_CHARS])
        return () if found is None else tuple(found) if isinstance(found, list) else (found,)

    def walk(self, text: str, node: Node, path: list[Node]) -> bool:
        """Extend `path` (the chain from the root to `node`) with the chunks `text` continues with
        after `node`; whether the last is a final node ending `text` (then touched: a partial
        match is touched by the insert that follows)."""
        size = len(text)
        pos = node.end
        exact = False
        while True:
            found = node.children.get(text[pos : pos + KEY_CHARS])
            if found is None:
                break
            nxt = None
            for child in found if isinstance(found, list) else (found,):
                if child.final:
                    if child.end == size and text.startswith(child.text, pos):
                        nxt = child
                        exact = True
                        break
                elif text.startswith(child.text, pos):
                    nxt = child
            if nxt is None:
                break
            path.append(nxt)
            if exact:
                break
            node = nxt
            pos = nxt.end
        if exact:
            self.touch(path[-1])
        return exact

    def insert(self, base: Node | None, chunks: list[tuple[str, array.array[int], bool]]) -> Node | None:
        """Add `chunks` below `base` (reusing equal chunks), touch the path, evict; the last
        chunk's node, or None if `base` is gone."""
        if base is None or not base.alive:
            return None  # evicted meanwhile; the next request for this text inserts it again
        node = base
        for text, ids, final in chunks:
            key = text[:KEY_CHARS]
            found = node.children.get(key)
            same = None
            if found is not None:
                for child in found if isinstance(found, list) else (found,):
                    if child.final == final and child.text == text:
                        same = child
                        break
            if same is None:
                same = Node(node, text, ids, node.end + len(text), final)
                if found is None:
                    node.children[key] = same
                elif isinstance(found, list):
                    found.append(same)
                else:
                    node.children[key] = [found, same]
                self.lru[same] = None
                self.cached_bytes += same.nbytes
                self.cached_tokens += len(ids)
                self.nodes += 1
            node = same
        if node is not base:
            self.touch(node)
        self._evict()
        return node if node.alive else None

    def touch(self, node: Node | None) -> None:
        """Mark `node` and its ancestors used, children before parents (the LRU's invariant)."""
        lru = self.lru
        while node is not None and node.parent is not None:
            lru.move_to_end(node)
            node = node.parent

    def _evict(self) -> None:
        while self.cached_bytes > self.max_bytes and self.lru:
            node, _ = self.lru.popitem(last=False)
            assert not node.children, "LRU order puts parents after their children"
            parent = node.parent
            assert parent is not None
            key = node.text[:KEY_CHARS]
            found = parent.children[key]
            if isinstance(found, list):
                found.remove(node)
                if len(found) == 1:
                    parent.children[key] = found[0]
            else:
                del parent.children[key]
            node.alive = False
            self.cached_bytes -= node.nbytes
            self.cached_tokens -= len(node.ids)
            self.nodes -= 1
            self.evictions += 1

    def clear(self) -> None:
        """Drop every chunk (`evictions` is kept)."""
        for node in self.lru:
            node.alive = False
        self.lru.clear()
        self.root.children = {}
        self.cached_bytes = self.cached_tokens = self.nodes = 0


def join(path: list[Node]) -> list[int]:
    """The ids of `path`'s chunks as one new list."""
    if not path:
        return []
    joined = array.array("I")
    for node in path:
        joined.extend(node.ids)
    return as_list(joined)


# Ids per `tolist` call in `as_list`: ~0.3 ms with the GIL held on a slow 2-core VM.
LIST_SLICE = 16384


def as_list(ids: array.array[int]) -> list[int]:
    """`ids.tolist()`, a slice at a time. One `tolist` of a 200k-token prompt holds the GIL for
    4-5 ms, in a tokenizer thread, and the event loop's thread waits all of it (a 1 ms ticker
    beside it: 8-9 ms gaps); in slices it gets the GIL back within ~2 ms, for ~10% more CPU."""
    if len(ids) <= LIST_SLICE:
        return ids.tolist()
    out = ids[:LIST_SLICE].tolist()
    for i in range(LIST_SLICE, len(ids), LIST_SLICE):
        out += ids[i : i + LIST_SLICE].tolist()
    return out


def shared(text: str, pos: int, other: str, known: int) -> int:
    """How many characters `text[pos:]` and `other` share, knowing the first `known` agree."""
    lo, hi = known, min(len(other), len(text) - pos) + 1  # lo agree, hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text.startswith(other[lo:mid], pos + lo):
            lo = mid
        else:
            hi = mid
    return lo
