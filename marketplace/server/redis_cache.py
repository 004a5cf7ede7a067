"""Django's Redis cache, keeping one client per connection pool.

Django's RedisCacheClient builds a new `redis.Redis` for every cache call; redis-py's client
constructor fills a table of some 170 response callbacks, about as much CPU as the call's
own round trip. Every API request makes two or three (the throttles), so the client is kept:
redis-py clients are thread-safe and their pools open new connections after a fork.
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class _KeptClient(RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        index = self._get_connection_pool_index(write)
        client = self._clients.get(index)
        if client is None:
            client = self._client(connection_pool=self._get_connection_pool(write))
            self._clients[index] = client
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _KeptClient
