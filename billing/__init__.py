"""Billing: price lists, metering of pools and monthly invoices."""
