"""The old private name of cyclone_worker.values, kept so that code written against it still imports."""

from .values import (MAX_JSON_DEPTH, Seconds, from_duration, from_struct, from_timestamp, from_value, ints_back,
                     seconds_of, to_duration, to_struct, to_timestamp, to_value)

__all__ = ["Seconds", "MAX_JSON_DEPTH", "to_value", "from_value", "to_struct", "from_struct", "ints_back",
           "seconds_of", "to_duration", "from_duration", "to_timestamp", "from_timestamp"]
