# Container images: envs/<image>.def -> containers/<image>.sif with the cluster's runtime
# (apptainer or singularity). Where the runtime is "none" no GPU rule asks for an image,
# so build_container is not part of the DAG and steps run in the virtual environment.
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from hpcllm.containers import ContainerRuntimeError, image_for, runtime_executable

CONTAINERS = config["containers"]

for _purpose, _images in CONTAINERS["use"].items():
    for _vendor, _image in _images.items():
        if _image not in CONTAINERS["images"]:
            raise ValueError(
                f"containers.use.{_purpose}.{_vendor} names image '{_image}', which is not "
                f"in containers.images ({', '.join(CONTAINERS['images']) or 'none defined'})"
            )


def containers_targets():
    return []  # built when a GPU step needs one (container_image)


def container_image(purpose):
    """[containers/<image>.sif] for a GPU step of ``purpose`` ("train", "vision"); [] without.

    GPU rules list it as an input, so the image is built before them.
    """
    image = image_for(CLUSTER, purpose, CONTAINERS["use"])
    return [] if image is None else [f"containers/{image}.sif"]


def container_definition(wildcards):
    """The image's definition file. Also where a missing runtime is caught: while the DAG
    is built for a real run (a dry run or --dag only warns: it builds nothing)."""
    path = CONTAINERS["images"][wildcards.image]
    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(workflow.basedir, path)
    try:
        runtime_executable(CLUSTER)
    except ContainerRuntimeError as e:
        if workflow.executor_plugin is not None and not workflow.dryrun:
            raise WorkflowError(str(e))
        logger.warning(f"Warning: {e}")
    return path


rule build_container:
    input:
        definition=container_definition,
    output:
        sif="containers/{image}.sif",
        digest="containers/{image}.digest.json",
    log:
        "logs/build_container/{image}.log",
    benchmark:
        "benchmarks/build_container/{image}.tsv"
    wildcard_constraints:
        image="|".join(CONTAINERS["images"]) or "NONE",
    # Login node where the site allows builds there (config/clusters: container_build).
    localrule: not CLUSTER.container_build.on_compute_node
    threads: 8
    resources:
        mem_mb=32000,
        runtime=120,
    params:
        runtime=CLUSTER.container_runtime,
        fakeroot=CLUSTER.container_build.fakeroot,
        build_args=CONTAINERS["build_args"],
    script:
        "../scripts/build_container.py"
