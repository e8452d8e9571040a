"""A person's own choices about the portal: the e-mails they want and the language they are written in."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class Preferences(models.Model):
    """A person's choices about the portal itself, e.g. which e-mails they want.

    E-mail topics are declared by the apps that send them (`portal.shell.EmailTopic`); every topic is on
    until the person turns it off, so a topic added later reaches everyone who has not said otherwise.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preferences", verbose_name=_("user")
    )
    emails_off = models.JSONField(
        _("e-mail topics turned off"),
        default=list,
        blank=True,
        help_text=_("Keys of the e-mail topics this person does not want."),
    )
    language = models.CharField(
        _("language of e-mails"),
        max_length=10,
        choices=settings.LANGUAGES,
        blank=True,
        help_text=_("The language the portal writes to this person in; the one they last chose, if any."),
    )

    class Meta:
        verbose_name = _("preferences")
        verbose_name_plural = _("preferences")

    def __str__(self) -> str:
        return f"preferences of {self.user}"

    @classmethod
    def wants_email(cls, user, topic: str) -> bool:
        off = cls.objects.filter(user=user).values_list("emails_off", flat=True).first()
        return topic not in (off or [])
