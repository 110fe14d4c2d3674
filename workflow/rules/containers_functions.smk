# The containers stage's globals, plan-time checks and input/params functions (its rules:
# containers.smk, which includes this file first).
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from hpcllm.containers import (
    ContainerRuntimeError,
    build_executable,
    image_for,
    image_plan_error,
    recipe_path,
)

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


def container_image(purpose, check=True):
    """[containers/<image>.sif] for a GPU step of ``purpose`` ("train", "vision"); [] without.

    GPU rules list it as an input, so the image is built before them. With ``check``, an
    image that can be neither found nor built here (a site without internet or builds)
    stops the plan, saying where to put it.
    """
    image = image_for(CLUSTER, purpose, CONTAINERS["use"])
    if image is None:
        return []
    sif = f"containers/{image}.sif"
    problem = check and image_plan_error(CLUSTER, image, sif, image_definition(image))
    if problem:
        raise WorkflowError(problem)
    return [sif]


def image_definition(image):
    path = CONTAINERS["images"][image]
    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(HPCLLM_ROOT, path)
    return path


def container_recipe(wildcards):
    """What the site's build method reads: the definition file, or its cotainr conda
    environment. Also where a missing build tool is caught: while the DAG is built for a
    real run (a dry run or --dag only warns: it builds nothing)."""
    try:
        build_executable(CLUSTER)
    except ContainerRuntimeError as e:
        if workflow.executor_plugin is not None and not workflow.dryrun:
            raise WorkflowError(str(e))
        logger.warning(f"Warning: {e}")
    return str(recipe_path(CLUSTER, image_definition(wildcards.image)))
