"""A resident, loaded model: its components on a device, its decoders, levers and sizing.

``load_instance(card, device=...)`` (``models.instance.resident``) is the documented way in,
so it is re-exported here with the instance type and its error.
"""

from models.instance.errors import InstanceError
from models.instance.resident import WanInstance, load_instance

__all__ = ["InstanceError", "WanInstance", "load_instance"]
