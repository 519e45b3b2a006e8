"""Shared fixtures: real Liftbridge servers from liftbridge_provider.devserver."""

pytest_plugins = ["liftbridge_provider.devserver.pytest_plugin"]
