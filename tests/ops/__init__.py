"""Tests of operating the portal: its workers under concurrency and failure, backup and restore."""
