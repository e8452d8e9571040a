"""Django admin of capacity: clusters (kubeconfig and Prometheus credential write-only), groups and what they
offer, nodes and GPUs with drain actions."""

from __future__ import annotations

import json
import re

from django import forms
from django.contrib import admin, messages
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from pools import capacity_version, kinds, selectors, services
from pools.models import Cluster, GpuCapacity, GpuGroup, NodeCapacity, SpecAndCount, WorkloadProfile
from portal.errors import PortalError


class _UrlField(forms.URLField):
    """An address typed without a scheme is taken as https (Django 6's default, chosen now)."""

    def __init__(self, **kwargs):
        super().__init__(assume_scheme="https", **kwargs)


class ClusterForm(forms.ModelForm):
    """The cluster's settings, checked by the same service that stores them (`register_cluster`)."""

    kubeconfig = forms.CharField(
        label=_("kubeconfig"),
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 6, "autocomplete": "off", "spellcheck": "false"}),
        help_text=_("Paste a kubeconfig to set or replace it. It is stored encrypted and never shown again."),
    )

    class Meta:
        model = Cluster
        fields = [
            "name",
            "driver",
            "context",
            "in_cluster",
            "mig_config_map",
            "device_plugin_config_map",
            "prometheus_url",
        ]
        field_classes = {"prometheus_url": _UrlField}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "device_plugin_config_map" in self.fields:  # left empty: keep the stored one, or the default
            self.fields["device_plugin_config_map"].required = False

    def registration(self) -> services.ClusterSettings:
        """What to register; name and driver never change once a cluster exists."""
        data = self.cleaned_data
        return services.ClusterSettings(
            name=self.instance.name if self.instance.pk else data.get("name", ""),
            driver=self.instance.driver if self.instance.pk else data.get("driver", ""),
            kubeconfig=data.get("kubeconfig") or None,  # left empty: keep the stored one
            context=data.get("context", ""),
            in_cluster=data.get("in_cluster", False),
            mig_config_map=data.get("mig_config_map", ""),
            device_plugin_config_map=data.get("device_plugin_config_map", ""),
            prometheus_url=data.get("prometheus_url", ""),
        )

    def clean(self):
        data = super().clean()
        if not self.errors:
            try:
                services.check_cluster(self.registration())
            except PortalError as error:
                self.add_error(error.field if error.field in self.fields else None, error.message)
        return data


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    # Long tables stay quick: 50 rows a page, and one COUNT (the filtered one), not a second of them all.
    list_per_page = 50
    show_full_result_count = False
    form = ClusterForm
    list_display = ["name", "driver", "status", "node_count", "last_sync_at", "last_change_at", "short_error"]
    list_filter = ["driver", "status"]
    search_fields = ["name"]
    readonly_fields = [
        "status",
        "has_kubeconfig",
        "has_prometheus_credential",
        "last_sync_at",
        "last_change_at",
        "last_error",
        "failures",
        "next_sync_at",
    ]
    actions = ["sync_now"]

    def get_fields(self, request, obj=None):
        # Shown read-only, the form's kubeconfig field would be filled by calling the model's method of that
        # name: the decrypted kubeconfig. Who may not change the cluster sees only whether one is stored.
        fields = super().get_fields(request, obj)
        editable = self.has_change_permission(request, obj) if obj else self.has_add_permission(request)
        return fields if editable else [name for name in fields if name != "kubeconfig"]

    def get_readonly_fields(self, request, obj=None):
        # A cluster's name and driver are where its nodes, GPUs and pools come from: they never change.
        return [*self.readonly_fields, "name", "driver"] if obj else self.readonly_fields

    def save_model(self, request, obj, form, change):
        # Checked by the form already; a refusal now (someone changed it meanwhile) is answered as such.
        cluster, _created = services.register_cluster(form.registration())
        obj.pk = cluster.pk
        if not change:
            services.request_sync(cluster=cluster)  # read it now, on a worker

    def get_queryset(self, request):
        from django.db.models import Count, Q

        return (
            super().get_queryset(request).annotate(node_count=Count("nodes", filter=Q(nodes__present=True)))
        )

    @admin.display(description=_("nodes"), ordering="node_count")
    def node_count(self, cluster):
        return cluster.node_count

    @admin.display(description=_("last error"))
    def short_error(self, cluster):
        return (cluster.last_error[:80] + "…") if len(cluster.last_error) > 80 else cluster.last_error

    @admin.display(description=_("kubeconfig stored"), boolean=True)
    def has_kubeconfig(self, cluster):
        return cluster.has_kubeconfig

    @admin.display(description=_("Prometheus credential stored"), boolean=True)
    def has_prometheus_credential(self, cluster):
        return cluster.has_prometheus_credential

    @admin.action(description=_("Sync the selected clusters now"), permissions=["change"])
    def sync_now(self, request, queryset):
        # A worker syncs: a slow or unreachable cluster must not hold up the web request.
        names = []
        for cluster in queryset:
            services.request_sync(cluster=cluster)
            names.append(cluster.name)
        self.message_user(
            request,
            _("A sync of %(names)s is on its way; the clusters list shows its outcome.")
            % {"names": ", ".join(names)},
            messages.SUCCESS,
        )


class OffersField(forms.CharField):
    """A group's offers typed as names apart (`whole, mig, ts-4`) or as a JSON list; checked by the kinds."""

    def prepare_value(self, value):
        if isinstance(value, list | tuple):
            return ", ".join(str(offer) for offer in value)
        if isinstance(value, str) and value.startswith("["):
            try:
                return self.prepare_value(json.loads(value))
            except ValueError:
                pass
        return value

    def to_python(self, value):
        text = super().to_python(value).strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except ValueError:
                raise forms.ValidationError(
                    _("Name the offers apart, e.g. whole, mig, ts-4."), code="offers"
                ) from None
        return [offer for offer in re.split(r"[\s,]+", text) if offer]

    def validate(self, value):
        try:
            kinds.parse_offers(value)
        except ValueError as error:
            raise forms.ValidationError(
                _("%(why)s Name the offers apart, e.g. whole, mig, ts-4.") % {"why": error}, code="offers"
            ) from None


class GpuGroupForm(forms.ModelForm):
    offers = OffersField(
        label=_("offers"),
        required=False,  # empty is refused by the kinds, saying what a group may offer
        help_text=_(
            "What the group gives out, e.g. whole, mig, ts-4: whole GPUs, MIG instances, and shares of a "
            "GPU, ts-N time-sliced or mps-N under MPS, N from 2 to 8. A node shares its MIG-off GPUs one way "
            "at a time."
        ),
    )

    class Meta:
        model = GpuGroup
        fields = ["cluster", "name", "description", "offers"]


@admin.register(GpuGroup)
class GpuGroupAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    form = GpuGroupForm
    list_display = ["name", "cluster", "description", "offer_list", "node_count"]
    list_filter = ["cluster"]
    search_fields = ["name", "description", "cluster__name"]

    def get_queryset(self, request):
        from django.db.models import Count

        return super().get_queryset(request).select_related("cluster").annotate(node_count=Count("nodes"))

    @admin.display(description=_("nodes"), ordering="node_count")
    def node_count(self, group):
        return group.node_count

    @admin.display(description=_("offers"))
    def offer_list(self, group):
        return ", ".join(group.offers) if isinstance(group.offers, list) else ""

    # Groups decide where work lands: availability computed before a change no longer holds.
    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        capacity_version.changed()

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        capacity_version.changed()

    def delete_queryset(self, request, queryset):
        super().delete_queryset(request, queryset)
        capacity_version.changed()


class SpecInline(admin.TabularInline):
    model = SpecAndCount
    extra = 0
    can_delete = False
    fields = ["resource_name", "profile", "capacity", "allocatable", "allocated"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


class DrainActions:
    """Admin actions shared by nodes and GPUs; each row goes through the drain service."""

    drain_service = None
    held_by = "gpu_ids"  # how `selectors.pools_holding` takes this model's ids

    def _drain(self, request, queryset, drained: bool):
        for obj in queryset:
            self.drain_service(obj, drained, request.user)
        text = (
            ngettext("%(count)d drained.", "%(count)d drained.", queryset.count())
            if drained
            else ngettext("%(count)d undrained.", "%(count)d undrained.", queryset.count())
        )
        self.message_user(request, text % {"count": queryset.count()}, messages.SUCCESS)
        held = selectors.pools_holding(**{self.held_by: [obj.pk for obj in queryset]}) if drained else []
        if held:
            self.message_user(
                request,
                gettext("These pools keep running on what was drained: %(pools)s.")
                % {"pools": ", ".join(p.name for p in held)},
                messages.WARNING,
            )

    @admin.action(description=_("Drain: give no new work"), permissions=["change"])
    def drain(self, request, queryset):
        self._drain(request, queryset, True)

    @admin.action(description=_("Undrain: accept new work again"), permissions=["change"])
    def undrain(self, request, queryset):
        self._drain(request, queryset, False)


@admin.register(NodeCapacity)
class NodeCapacityAdmin(DrainActions, admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = [
        "name",
        "cluster",
        "group",
        "gpu_model",
        "gpu_count",
        "ready",
        "mig_state",
        "drained",
        "present",
    ]
    list_filter = ["cluster", "group", "gpu_model", "drained", "present", "ready", "mig_state"]
    list_select_related = ["cluster", "group"]
    search_fields = ["name", "cluster__name"]
    fields = [
        "cluster",
        "name",
        "group",
        "gpu_model",
        "gpu_count",
        "ready",
        "mig_strategy",
        "mig_config",
        "mig_state",
        "sharing",
        "sharing_config",
        "drained",
        "present",
        "error",
        "first_seen_at",
        "last_change_at",
    ]
    readonly_fields = [f for f in fields if f not in ("group", "drained")]
    inlines = [SpecInline]
    actions = ["drain", "undrain"]
    held_by = "node_ids"

    @staticmethod
    def drain_service(node, drained, actor):
        services.set_node_drained(node=node, drained=drained, actor=actor)

    def save_model(self, request, obj, form, change):
        if "group" in form.changed_data:
            services.set_node_group(node=obj, group=obj.group)
        if "drained" in form.changed_data:
            services.set_node_drained(node=obj, drained=obj.drained, actor=request.user)

    def has_add_permission(self, request):
        return False  # nodes come from the clusters themselves

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "group":
            node_id = request.resolver_match.kwargs.get("object_id")
            if node_id:
                kwargs["queryset"] = GpuGroup.objects.filter(cluster__nodes__pk=node_id)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(GpuCapacity)
class GpuCapacityAdmin(DrainActions, admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["__str__", "model", "uuid", "mig_enabled", "health", "drained", "present"]
    list_filter = ["node__cluster", "model", "mig_enabled", "health", "drained", "present"]
    list_select_related = ["node__cluster"]
    search_fields = ["uuid", "node__name", "node__cluster__name"]
    fields = [
        "node",
        "index",
        "uuid",
        "model",
        "memory_mib",
        "mig_capable",
        "mig_enabled",
        "layout",
        "health",
        "drained",
        "present",
        "last_change_at",
    ]
    readonly_fields = [f for f in fields if f != "drained"]
    actions = ["drain", "undrain"]

    @staticmethod
    def drain_service(gpu, drained, actor):
        services.set_gpu_drained(gpu=gpu, drained=drained, actor=actor)

    def save_model(self, request, obj, form, change):
        if "drained" in form.changed_data:
            services.set_gpu_drained(gpu=obj, drained=obj.drained, actor=request.user)

    def has_add_permission(self, request):
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(SpecAndCount)
class SpecAndCountAdmin(ReadOnlyAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["node", "resource_name", "profile", "capacity", "allocatable", "allocated"]
    list_filter = ["node__cluster", "profile"]
    list_select_related = ["node__cluster"]
    search_fields = ["node__name", "resource_name"]


@admin.register(WorkloadProfile)
class WorkloadProfileAdmin(ReadOnlyAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = [
        "pod_name",
        "namespace",
        "project",
        "cluster",
        "node_name",
        "resource_name",
        "count",
        "phase",
        "present",
        "last_seen_at",
    ]
    list_filter = ["cluster", "phase", "present", "resource_name"]
    list_select_related = ["cluster", "project"]
    search_fields = ["pod_name", "namespace", "node_name"]
