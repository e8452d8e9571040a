"""The portal's admission policy applied to a cluster through the client: who the portal is there (a
SelfSubjectReview), then the policy and its binding created where missing and put back where changed.
What the policy says is pools/drivers/admission.py."""

from __future__ import annotations

import json

from django.utils.translation import gettext as _
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pools.drivers import admission
from pools.drivers.base import DriverError

_ADMISSION_API = f"{admission.ADMISSION_API} ValidatingAdmissionPolicy"


class PolicyApi:
    def __init__(self, api_client: client.ApiClient, timeout: tuple[int, int]) -> None:
        self.admission = client.AdmissionregistrationV1Api(api_client)
        self.authentication = client.AuthenticationV1Api(api_client)
        self.timeout = timeout
        self._username: str | None = None

    def username(self) -> str:
        """The user the cluster knows the portal's credentials as."""
        if self._username is None:
            review = client.V1SelfSubjectReview.from_dict(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            )
            response = self.authentication.create_self_subject_review(
                review, _request_timeout=self.timeout, _preload_content=False
            )
            user = ((json.loads(response.data).get("status") or {}).get("userInfo") or {}).get("username")
            if not user:
                raise DriverError(_("The cluster did not say which user the portal's credentials are."))
            self._username = user
        return self._username

    def ensure(self) -> str:
        """Apply the policy and its binding; returns "" when both were as shipped, else what was not."""
        found = [
            self._ensure(
                admission.portal_policy(self.username()),
                read=self.admission.read_validating_admission_policy,
                create=self.admission.create_validating_admission_policy,
                replace=self.admission.replace_validating_admission_policy,
                model=client.V1ValidatingAdmissionPolicy,
            ),
            self._ensure(
                admission.portal_policy_binding(),
                read=self.admission.read_validating_admission_policy_binding,
                create=self.admission.create_validating_admission_policy_binding,
                replace=self.admission.replace_validating_admission_policy_binding,
                model=client.V1ValidatingAdmissionPolicyBinding,
            ),
        ]
        return " ".join(note for note in found if note)

    def _ensure(self, wanted: dict, *, read, create, replace, model) -> str:
        name = wanted["metadata"]["name"]
        try:
            current = json.loads(read(name, _request_timeout=self.timeout, _preload_content=False).data)
        except ApiException as error:
            if error.status != 404:
                raise
            current = None
        drift = admission.drift(wanted, current)
        if not drift:
            return ""
        if current is None:
            try:
                create(model.from_dict(wanted), _request_timeout=self.timeout)
            except ApiException as error:
                if error.status == 404:
                    raise DriverError(
                        _(
                            "The cluster does not serve %(api)s (Kubernetes 1.30 or later), so the portal "
                            "cannot keep other namespaces off its pools' GPUs."
                        )
                        % {"api": _ADMISSION_API}
                    ) from None
                raise
            return admission.restored_text(wanted, drift)
        body = {
            **wanted,
            "metadata": {**wanted["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        replace(name, model.from_dict(body), _request_timeout=self.timeout)
        return admission.restored_text(wanted, drift)
