"""One invoice as a file: CSV and XLSX for accounting, PDF as the document sent to the tenant; a credit
note as a PDF document too.

Every format carries the same rows (`rows`): the lines of the invoice with project, spec, hours,
unit price and amount, then subtotal, tax and total. The PDF names the tenant's billing profile,
the period and the number; it embeds a CJK font (BILLING_PDF_FONT) so that Hangul names print.
CSV and XLSX rows are written through `portal.spreadsheets`, so that no text a tenant typed runs as a
formula in the spreadsheet that opens them; hours and money go in as numbers.
"""

from __future__ import annotations

import io
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

from django.http import HttpResponse
from django.utils.timezone import localtime
from django.utils.translation import gettext as _
from fpdf import FPDF, FontFace
from openpyxl import Workbook

from billing.conf import settings
from billing.invoicing import round_money
from billing.models import BillingProfile, CreditNote, Invoice
from pools.specs import Spec
from portal.errors import PortalError
from portal.spreadsheets import CsvWriter, append_row

FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "pdf": "application/pdf",
}
HEADER = ["project", "spec", "hours", "unit_price", "amount"]


class ExportUnavailable(PortalError):
    status_code = 503


def filename(invoice: Invoice, extension: str) -> str:
    return f"invoice-{invoice.number or f'draft-{invoice.pk}'}-{invoice.tenant.slug}.{extension}"


Cell = str | Decimal | None


def _price(price: Decimal | None) -> Decimal | None:
    """A unit price without trailing zeros, written out in full (never as an exponent)."""
    return None if price is None else Decimal(f"{price.normalize():f}")


def rows(invoice: Invoice) -> list[list[Cell]]:
    """The usage lines, then subtotal, tax (with its rate) and total: text as text, hours and money as
    numbers (money in the currency's minor unit), None where a row has no such figure."""

    def money(amount: Decimal) -> Decimal:
        return round_money(amount, invoice.currency)

    found: list[list[Cell]] = []
    for line in invoice.lines.filter(kind="usage").select_related("project").order_by("project__slug", "pk"):
        found.append(
            [
                line.project.slug if line.project else "",
                Spec(line.gpu_model, line.profile).id,
                line.hours.quantize(Decimal("0.0001")),
                _price(line.unit_price),
                money(line.amount),
            ]
        )
    found.append(["", "subtotal", None, None, money(invoice.subtotal)])
    found.append(["", f"tax {invoice.tax_rate.normalize():f}%", None, None, money(invoice.tax)])
    found.append(["", "total", None, None, money(invoice.total)])
    return found


def as_csv(invoice: Invoice) -> bytes:
    out = io.StringIO()
    writer = CsvWriter(out)
    writer.writerow(
        [
            "invoice",
            invoice.number or "",
            "tenant",
            invoice.tenant.slug,
            "month",
            f"{invoice.month:%Y-%m}",
            "currency",
            invoice.currency,
        ]
    )
    writer.writerow(HEADER)
    writer.writerows(rows(invoice))
    return out.getvalue().encode("utf-8")


def as_xlsx(invoice: Invoice) -> bytes:
    book = Workbook()
    sheet = book.active
    sheet.title = f"{invoice.month:%Y-%m}"
    append_row(
        sheet,
        [
            "invoice",
            invoice.number or "",
            "tenant",
            invoice.tenant.slug,
            "month",
            f"{invoice.month:%Y-%m}",
            "currency",
            invoice.currency,
        ],
    )
    append_row(sheet, HEADER)
    for row in rows(invoice):
        append_row(sheet, row)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def _document(title: str) -> FPDF:
    """An A4 page with the CJK font (named "portal"), or the refusal naming the missing font."""
    font = Path(settings.BILLING_PDF_FONT)
    if not font.is_file():
        raise ExportUnavailable(
            _("PDF export needs the font %(font)s (Debian: fonts-noto-cjk).") % {"font": font}
        )
    pdf = FPDF(format="A4")
    pdf.set_title(title)
    pdf.add_font("portal", fname=str(font), collection_font_number=settings.BILLING_PDF_FONT_INDEX)
    pdf.add_page()
    return pdf


def _profile_facts(profile: BillingProfile | None) -> list[tuple[str, str]]:
    """Where a document is addressed: the tenant's billing profile, as far as it is filled in."""
    if profile is None:
        return []
    return [
        (_("Address"), profile.address),
        (_("Tax ID"), profile.tax_id),
        (_("Cost centre"), profile.cost_centre),
        (_("PO number"), profile.po_number),
    ]


def _write_facts(pdf: FPDF, facts: list[tuple[str, str]]) -> None:
    """One `label: value` line per fact that has a value."""
    for label, value in facts:
        if value:
            pdf.multi_cell(0, 6, f"{label}: {value}", new_x="LMARGIN", new_y="NEXT")


def as_pdf(invoice: Invoice) -> bytes:
    pdf = _document(filename(invoice, "pdf"))
    profile = BillingProfile.objects.filter(tenant=invoice.tenant).first()
    pdf.set_font("portal", size=16)
    pdf.cell(text=f"{_('Invoice')} {invoice.number or _('(draft)')}", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("portal", size=10)
    facts = [
        (_("Tenant"), (profile.legal_name if profile and profile.legal_name else invoice.tenant.name)),
        (_("Month"), f"{invoice.month:%Y-%m} ({settings.BILLING_TIME_ZONE})"),
        (_("Issued"), f"{invoice.issued_at:%Y-%m-%d}" if invoice.issued_at else "—"),
    ]
    _write_facts(pdf, facts + _profile_facts(profile))
    pdf.ln(4)
    widths = (40, 60, 25, 30, 35)
    align = ("LEFT", "LEFT", "RIGHT", "RIGHT", "RIGHT")
    with pdf.table(col_widths=widths, text_align=align, headings_style=FontFace(emphasis=None)) as table:
        table.row(
            [_("Project"), _("Spec"), _("Hours"), _("Unit price"), f"{_('Amount')} ({invoice.currency})"]
        )
        for values in rows(invoice):
            table.row(["" if value is None else f"{value}" for value in values])
    return bytes(pdf.output())


def export(invoice: Invoice, kind: str) -> tuple[bytes, str, str]:
    """The file's bytes, content type and name."""
    make = {"csv": as_csv, "xlsx": as_xlsx, "pdf": as_pdf}[kind]
    return make(invoice), FORMATS[kind], filename(invoice, kind)


def export_credit_note(note: CreditNote) -> tuple[bytes, str, str]:
    """The credit note's PDF: its bytes, content type and name."""
    return credit_note_pdf(note), FORMATS["pdf"], credit_note_filename(note)


def download(file: tuple[bytes, str, str]) -> HttpResponse:
    """A file of `export`, `export_month` or `export_credit_note` as a download."""
    content, media, name = file
    response = HttpResponse(content, content_type=media)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


MONTH_HEADER = [
    "month",
    "invoice",
    "state",
    "tenant",
    "legal_name",
    "cost_centre",
    "po_number",
    "project",
    "spec",
    "hours",
    "unit_price",
    "amount",
    "tax",
    "currency",
]


def month_rows(month) -> list[list[Cell]]:
    """Every invoice of a month that is not void, for accounting: one row per usage line (its amount),
    then one per invoice for its tax; the amounts add up to the subtotals, the taxes to the tax. Text as
    given, hours and money as numbers, None where a row has no such figure."""
    invoices = (
        Invoice.objects.filter(month=month)
        .exclude(state="void")
        .select_related("tenant", "tenant__billing_profile")
        .prefetch_related("lines__project")
        .order_by("tenant__slug", "pk")
    )
    found = []
    for invoice in invoices:
        profile = getattr(invoice.tenant, "billing_profile", None)
        head = [
            f"{invoice.month:%Y-%m}",
            invoice.number or "",
            invoice.state,
            invoice.tenant.slug,
            profile.legal_name if profile else "",
            profile.cost_centre if profile else "",
            profile.po_number if profile else "",
        ]
        for line in sorted(invoice.lines.all(), key=lambda line: (line.kind != "usage", line.pk)):
            money = round_money(line.amount, invoice.currency)
            if line.kind == "usage":
                project = line.project.slug if line.project else ""
                hours = line.hours.quantize(Decimal("0.0001"))
                spec = Spec(line.gpu_model, line.profile).id
                found.append(
                    [*head, project, spec, hours, _price(line.unit_price), money, None, invoice.currency]
                )
            else:
                found.append([*head, "", "", None, None, None, money, invoice.currency])
    return found


def month_csv(month) -> bytes:
    out = io.StringIO()
    writer = CsvWriter(out)
    writer.writerow(MONTH_HEADER)
    writer.writerows(month_rows(month))
    return out.getvalue().encode("utf-8")


def month_xlsx(month) -> bytes:
    """The same rows; hours and money as numbers, so that the sheet sums them."""
    book = Workbook()
    sheet = book.active
    sheet.title = f"{month:%Y-%m}"
    append_row(sheet, MONTH_HEADER)
    for row in month_rows(month):
        append_row(sheet, [None if value == "" else value for value in row])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


MONTH_FORMATS = {"csv": (month_csv, FORMATS["csv"]), "xlsx": (month_xlsx, FORMATS["xlsx"])}


def export_month(month, kind: str) -> tuple[bytes, str, str]:
    make, media = MONTH_FORMATS[kind]
    return make(month), media, f"invoices-{month:%Y-%m}.{kind}"


def credit_note_filename(note: CreditNote) -> str:
    return f"credit-note-{note.number}-{note.invoice.tenant.slug}.pdf"


def credit_note_pdf(note: CreditNote) -> bytes:
    """The credit note as the document sent to the tenant: who, which invoice, why, net, tax, total."""
    invoice, tenant = note.invoice, note.invoice.tenant
    pdf = _document(credit_note_filename(note))
    profile = BillingProfile.objects.filter(tenant=tenant).first()
    pdf.set_font("portal", size=16)
    pdf.cell(text=f"{_('Credit note')} {note.number}", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("portal", size=10)
    facts = [
        (_("Tenant"), profile.legal_name if profile and profile.legal_name else tenant.name),
        (_("Issued"), f"{localtime(note.issued_at, ZoneInfo(settings.BILLING_TIME_ZONE)):%Y-%m-%d}"),
        (_("Credits invoice"), f"{invoice.number} ({invoice.month:%Y-%m})"),
    ]
    _write_facts(pdf, [*facts, *_profile_facts(profile), (_("Reason"), note.reason)])
    pdf.ln(4)
    with pdf.table(
        col_widths=(120, 70), text_align=("LEFT", "RIGHT"), headings_style=FontFace(emphasis=None)
    ) as table:
        table.row(["", f"{_('Amount')} ({note.currency})"])
        table.row([_("Net amount"), f"{round_money(note.subtotal, note.currency)}"])
        table.row([f"{_('Tax')} {note.tax_rate.normalize():f}%", f"{round_money(note.tax, note.currency)}"])
        table.row([_("Total credited"), f"{round_money(note.total, note.currency)}"])
    return bytes(pdf.output())
