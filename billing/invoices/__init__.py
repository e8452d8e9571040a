"""Invoices' state changes: closing a month into drafts, issuing (gap-free numbers), paid, void, and
credit notes, the only correction of an issued invoice. One module per step, every name here:

- closing: a month's drafts, built and rebuilt from the usage records (`close_month`, `preview_month`);
- lifecycle: `issue`, `mark_paid`, `void`, and the numbers of both series (`next_number`);
- credit_notes: `credit` against an issued or paid invoice, checked as forms check (`check_credit`);
- trail: what each change writes to the audit trail.

Issued invoices and credit notes are e-mailed to the tenant once committed (billing/mail.py).
"""

from billing.invoices.closing import (
    Closing,
    Draft,
    close_month,
    draft_of,
    month_to_close,
    month_usage,
    preview_month,
    tax_rate_of,
)
from billing.invoices.credit_notes import check_credit, credit, credit_terms, credited
from billing.invoices.lifecycle import issue, mark_paid, next_number, void

__all__ = [
    "Closing",
    "Draft",
    "check_credit",
    "close_month",
    "credit",
    "credit_terms",
    "credited",
    "draft_of",
    "issue",
    "mark_paid",
    "month_to_close",
    "month_usage",
    "next_number",
    "preview_month",
    "tax_rate_of",
    "void",
]
