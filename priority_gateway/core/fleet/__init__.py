"""Gateway replicas as one fleet: what each tells the others, and what it does with what it hears.

- ``wire``: the one batch format (facts, engine reports with evidence, tenant counts; signed with the
  fleet's secret when it has one).
- ``table``: the one table of what every replica last published, bounded and expiring.
- ``holdings``: the fleet's one admission gate: the slots each replica may fill on each engine.
- ``channel``: the channel's state (starting, up, down) and its rule while it cannot be trusted, the
  safe share.
- ``replica``: this replica's side of the protocol (``Fleet``): bytes in, decisions out.
"""

from priority_gateway.core.fleet.replica import Fleet, FleetDecisions, FleetEvent, FleetSettings

__all__ = ["Fleet", "FleetDecisions", "FleetEvent", "FleetSettings"]
