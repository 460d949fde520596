"""MetricService's monitored-resource calls (ListMonitoredResourceDescriptors,
GetMonitoredResourceDescriptor), answered for the resource types the local collector stores:
`prometheus_target`, the type of every series that arrives over OTLP (with the labels
series.resource_labels gives it), and the types a CreateTimeSeries may name (writes.py).
Cloud Monitoring lists every type it knows (pubsub_topic, ...); a Get of a type the collector
does not store is NOT_FOUND, naming the ones it does."""

from __future__ import annotations

import re

import grpc
from google.api import label_pb2, monitored_resource_pb2
from google.cloud import monitoring_v3

from distrl.otel.filters import RESOURCE_TYPE, Refused, excerpt, invalid, parse_filter, project_of

PROJECT = ("project_id", "The project of the request (locally: any name).")
# Each type's display name and labels, as Cloud Monitoring's list of monitored resource types
# gives them (cloud.google.com/monitoring/api/resources). The labels of prometheus_target are
# the ones every OTLP series carries (the monitoring module's docstring says where each comes
# from, as GKE Managed OpenTelemetry fills them).
TYPES = {
    RESOURCE_TYPE: ("Prometheus Target", (
        PROJECT,
        ("location", "Where the target runs: a Google Cloud region or zone (locally: local)."),
        ("cluster", "The Kubernetes cluster of the target (locally: local)."),
        ("namespace", "The target's namespace (OpenTelemetry: service.namespace)."),
        ("job", "The target's job (OpenTelemetry: service.name)."),
        ("instance", "The target's instance (OpenTelemetry: service.instance.id)."))),
    "global": ("Global", (PROJECT,)),
    "gce_instance": ("VM Instance", (
        PROJECT, ("instance_id", "The numeric VM instance identifier."),
        ("zone", "The Compute Engine zone of the VM."))),
    "generic_node": ("Generic Node", (
        PROJECT, ("location", "Where the node runs."), ("namespace", "A namespace of nodes."),
        ("node_id", "The node's identifier."))),
    "generic_task": ("Generic Task", (
        PROJECT, ("location", "Where the task runs."), ("namespace", "A namespace of jobs."),
        ("job", "The task's job."), ("task_id", "The task's identifier within its job."))),
    "k8s_container": ("Kubernetes Container", (
        PROJECT, ("location", "The cluster's region or zone."),
        ("cluster_name", "The cluster's name."), ("namespace_name", "The pod's namespace."),
        ("pod_name", "The pod's name."), ("container_name", "The container's name."))),
}
NAME = re.compile(r"projects/([^/]+)/monitoredResourceDescriptors/([^/]+)")
_ListResponse = monitoring_v3.ListMonitoredResourceDescriptorsResponse.pb()


def label_keys(resource_type: str) -> tuple[str, ...]:
    """The labels a series of this type carries, project_id first."""
    return tuple(key for key, _ in TYPES[resource_type][1])


def descriptor(project: str, resource_type: str = RESOURCE_TYPE
               ) -> monitored_resource_pb2.MonitoredResourceDescriptor:
    display_name, labels = TYPES[resource_type]
    return monitored_resource_pb2.MonitoredResourceDescriptor(
        name=f"projects/{project}/monitoredResourceDescriptors/{resource_type}",
        type=resource_type, display_name=display_name,
        description=(f"A {display_name.lower()}" + (
            ": here, each process exporting OpenTelemetry metrics to the local collector."
            if resource_type == RESOURCE_TYPE else
            "; the local collector stores what CreateTimeSeries writes for it.")),
        labels=[label_pb2.LabelDescriptor(key=key, description=text,
                                          value_type=label_pb2.LabelDescriptor.STRING)
                for key, text in labels])


def list_descriptors(request):
    """ListMonitoredResourceDescriptors: the filter may name resource.type only (Cloud
    Monitoring's documented use); one page holds every type the collector stores."""
    project = project_of(request.name, "name")
    terms = parse_filter(request.filter) if request.filter else []
    for t in terms:
        if t.scope != "resource.type":
            raise invalid(f"filter {excerpt(request.filter)}: ListMonitoredResourceDescriptors "
                           "filters on resource.type only")
    if request.page_size < 0:
        raise invalid(f"page_size {request.page_size} is invalid: expected a positive number")
    if request.page_token:  # the first page holds them all: no token was ever given
        raise invalid(f"page_token {excerpt(request.page_token)} is not one this collector gave")
    response = _ListResponse()
    response.resource_descriptors.extend(descriptor(project, resource_type)
                                         for resource_type in sorted(TYPES)
                                         if all(t.matches(resource_type) for t in terms))
    return response


def get_descriptor(request):
    match = NAME.fullmatch(request.name)
    if not match:
        raise invalid(f"name {excerpt(request.name)} is invalid: expected "
                       "projects/PROJECT_ID/monitoredResourceDescriptors/RESOURCE_TYPE")
    project, resource_type = match.groups()
    if resource_type not in TYPES:
        raise Refused(grpc.StatusCode.NOT_FOUND, f"no monitored resource descriptor "
                      f"{excerpt(resource_type)}: the local collector stores series of "
                      f"{', '.join(sorted(TYPES))}")
    return descriptor(project, resource_type)
