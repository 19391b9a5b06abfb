"""SQLAlchemy models of playrun; the schema is owned by the Alembic migrations beside them."""

from models.base import Base, JSONType, UTCDateTime, db_now, new_id
from models.ids import new_task_id, uuid7
from models.placement import OrgPlacement, PlacementPolicy
from models.pools import PoolMember, WarmPool
from models.receipts import WorkReceipt
from models.resources import CapacityLease, CapacityOrg, RuntimeResource, TrafficPolicy
from models.runs import Attempt, EventDelivery, Outbox, PlayBundle, Run, RunEvent
from models.sheets import Sheet, SheetRow, SheetWriteIntent

__all__ = [
    "Attempt",
    "Base",
    "CapacityLease",
    "CapacityOrg",
    "EventDelivery",
    "JSONType",
    "OrgPlacement",
    "Outbox",
    "PlacementPolicy",
    "PlayBundle",
    "PoolMember",
    "Run",
    "RunEvent",
    "RuntimeResource",
    "Sheet",
    "SheetRow",
    "SheetWriteIntent",
    "TrafficPolicy",
    "UTCDateTime",
    "WarmPool",
    "WorkReceipt",
    "db_now",
    "new_id",
    "new_task_id",
    "uuid7",
]
