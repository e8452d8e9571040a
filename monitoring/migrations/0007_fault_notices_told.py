"""The faults told before the notifications carried them: who was e-mailed about each flagged pool becomes
the fault's sent notifications, and the flagged pools keep no e-mail records of their own. Apart from the
schema change before it, so that no row is written where that change still has indexes to build."""

from django.db import migrations


def settle_told_faults(apps, schema_editor):
    """A fault whose pools were all e-mailed about (or that flagged none), or that is cleared already, has
    been told; one with a pool still waiting is told by the next alert evaluation. Who was e-mailed about
    each pool becomes the fault's sent notifications, one per address, as they are kept from now on."""
    GpuFault = apps.get_model("monitoring", "GpuFault")
    FaultNotice = apps.get_model("monitoring", "FaultNotice")
    Delivery = apps.get_model("monitoring", "Delivery")
    for fault in GpuFault.objects.all():
        notices = list(FaultNotice.objects.filter(fault=fault).order_by("pool_id"))
        sent = [notice.sent_at for notice in notices if notice.sent_at is not None]
        told: dict[str, tuple[list[int], object]] = {}
        for notice in (notice for notice in notices if notice.sent_at is not None):
            for address in filter(None, (a.strip() for a in notice.recipients.split(","))):
                pools, _at = told.setdefault(address, ([], notice.sent_at))
                pools.append(notice.pool_id)
        Delivery.objects.bulk_create(
            Delivery(
                fault=fault,
                fault_pools=pools,
                channel="email",
                target=address,
                attempts=1,
                sent_at=at,
            )
            for address, (pools, at) in told.items()
        )
        if len(sent) == len(notices):
            fault.notified_at = max(sent, default=fault.at)
        elif fault.cleared_at is not None:
            fault.notified_at = fault.cleared_at
        else:
            continue
        fault.save(update_fields=["notified_at"])


class Migration(migrations.Migration):
    dependencies = [
        ("monitoring", "0006_notifications_for_faults"),
    ]

    operations = [
        migrations.RunPython(settle_told_faults, migrations.RunPython.noop),
        migrations.RemoveField(model_name="faultnotice", name="recipients"),
        migrations.RemoveField(model_name="faultnotice", name="sent_at"),
    ]
