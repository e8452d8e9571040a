"""A billed pool's idle spell on its page, a section of the pool page: since when it is idle, the idle hours
and what they cost (the figures of its people's e-mail, monitoring/selectors/idle.py), and a button that
releases it for those who may."""

from __future__ import annotations

from django.http import HttpRequest
from django.template.loader import render_to_string

from monitoring.selectors.idle import idle_spell
from pools.models import Pool
from pools.services.requests import asked_or_administers


def pool_section(request: HttpRequest, pool: Pool) -> str:
    """While the pool is idle: the spell's figures, and the release button for who asked for it or an admin
    of its tenant (the rule the release itself checks). Nothing otherwise: once the pool works again, its
    cost is in billing's section."""
    spell = idle_spell(pool=pool)
    if spell is None:
        return ""
    context = {
        "pool": pool,
        "tenant_slug": pool.project.tenant.slug,
        "spell": spell,
        "may_release": asked_or_administers(request.user, pool.request),
    }
    return render_to_string("monitoring/_pool_idle.html", context, request=request)
