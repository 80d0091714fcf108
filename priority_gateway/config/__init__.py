"""The gateway's configuration: typed sections (``sections``), read from YAML, ``GATEWAY__*``
environment variables and command-line options (``load``), documented in
``docs/configuration.md`` (``reference``)."""

from priority_gateway.config.load import load_config, parse_config
from priority_gateway.config.schema import ConfigError, Raw
from priority_gateway.config.sections import (
    POLICY_NAMES,
    AdmissionConfig,
    ClassConfig,
    ClassesConfig,
    Config,
    FleetConfig,
    HealthConfig,
    KeysConfig,
    ListenConfig,
    PoolConfig,
    PrefixConfig,
    PrefixPolicyConfig,
    ScrapeConfig,
    UpstreamConfig,
)

__all__ = [
    "POLICY_NAMES",
    "AdmissionConfig",
    "ClassConfig",
    "ClassesConfig",
    "Config",
    "ConfigError",
    "FleetConfig",
    "HealthConfig",
    "KeysConfig",
    "ListenConfig",
    "PoolConfig",
    "PrefixConfig",
    "PrefixPolicyConfig",
    "Raw",
    "ScrapeConfig",
    "UpstreamConfig",
    "load_config",
    "parse_config",
]
