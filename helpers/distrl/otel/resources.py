"""MetricService's monitored-resource calls (ListMonitoredResourceDescriptors,
GetMonitoredResourceDescriptor), answered for the one resource type the local collector stores:
`prometheus_target`, with the labels its series carry (series.resource_labels). Cloud
Monitoring lists every type it knows (gce_instance, pubsub_topic, ...); the collector lists
the types it has series of, and a Get of any other type is NOT_FOUND, naming the one it has."""

from __future__ import annotations

import re

import grpc
from google.api import label_pb2, monitored_resource_pb2
from google.cloud import monitoring_v3

from distrl.otel.filters import RESOURCE_TYPE, Refused, excerpt, invalid, parse_filter, project_of

# The labels of prometheus_target that every series of the collector carries (the monitoring
# module's docstring says where each comes from, as GKE Managed OpenTelemetry fills them).
LABELS = (
    ("project_id", "The project of the request (locally: any name)."),
    ("location", "Where the target runs: a Google Cloud region or zone (locally: local)."),
    ("cluster", "The Kubernetes cluster of the target (locally: local)."),
    ("namespace", "The target's namespace (OpenTelemetry: service.namespace)."),
    ("job", "The target's job (OpenTelemetry: service.name)."),
    ("instance", "The target's instance (OpenTelemetry: service.instance.id)."))
NAME = re.compile(r"projects/([^/]+)/monitoredResourceDescriptors/([^/]+)")
_ListResponse = monitoring_v3.ListMonitoredResourceDescriptorsResponse.pb()


def descriptor(project: str) -> monitored_resource_pb2.MonitoredResourceDescriptor:
    return monitored_resource_pb2.MonitoredResourceDescriptor(
        name=f"projects/{project}/monitoredResourceDescriptors/{RESOURCE_TYPE}",
        type=RESOURCE_TYPE, display_name="Prometheus Target",
        description="A target whose metrics arrive as Prometheus metrics: here, each process "
                    "exporting OpenTelemetry metrics to the local collector.",
        labels=[label_pb2.LabelDescriptor(key=key, description=text,
                                          value_type=label_pb2.LabelDescriptor.STRING)
                for key, text in LABELS])


def list_descriptors(request):
    """ListMonitoredResourceDescriptors: the filter may name resource.type only (Cloud
    Monitoring's documented use); one page holds every type the collector has."""
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
    if all(t.matches(RESOURCE_TYPE) for t in terms):
        response.resource_descriptors.append(descriptor(project))
    return response


def get_descriptor(request):
    match = NAME.fullmatch(request.name)
    if not match:
        raise invalid(f"name {excerpt(request.name)} is invalid: expected "
                       "projects/PROJECT_ID/monitoredResourceDescriptors/RESOURCE_TYPE")
    project, resource_type = match.groups()
    if resource_type != RESOURCE_TYPE:
        raise Refused(grpc.StatusCode.NOT_FOUND, f"no monitored resource descriptor "
                      f"{excerpt(resource_type)}: the local collector stores series of "
                      f"{RESOURCE_TYPE} only")
    return descriptor(project)

