"""geosense.settings with channels_redis' core `RedisChannelLayer` (Redis lists) instead of the
`RedisPubSubChannelLayer` the app uses with REDIS_URL: bench/scale.py measures both.

No client-side socket time-out: the core layer's receive blocks in BZPOPMIN for up to 5 s,
and redis-py 8 cuts any read at 5 s by default, which tears an idle consumer down
(channels_redis issue 422)."""

from geosense.settings import *  # noqa: F403
from geosense.settings import REDIS_URL

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]},
    }
}
