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
    HealthConfig,
    KeysConfig,
    ListenConfig,
    PoolConfig,
    PrefixConfig,
    PrefixPolicyConfig,
    RoutingShareConfig,
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
    "HealthConfig",
    "KeysConfig",
    "ListenConfig",
    "PoolConfig",
    "PrefixConfig",
    "PrefixPolicyConfig",
    "Raw",
    "RoutingShareConfig",
    "ScrapeConfig",
    "UpstreamConfig",
    "load_config",
    "parse_config",
]
