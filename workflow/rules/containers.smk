# Container images: containers/<image>.sif, made the site's way (config/clusters:
# container_build.method): from envs/<image>.def with the cluster's runtime (apptainer or
# singularity), or with cotainr from envs/<image>.cotainr.yml; where the site builds
# nothing (method copy) there is no rule: the image is a file the user copies in, used as
# it is. Where the runtime is "none" no GPU rule asks for an image, so build_container is
# not part of the DAG and steps run in the virtual environment.


include: "containers_functions.smk"


# A site that builds nothing has no rule for the image: a copied image is a source file,
# never rebuilt (and never removed for a rebuild) whatever its age.
if CLUSTER.container_build.method != "copy":

    rule build_container:
        input:
            recipe=container_recipe,
        output:
            sif="containers/{image}.sif",
            digest="containers/{image}.digest.json",
        log:
            "logs/build_container/{image}.log",
        benchmark:
            "results/timings/build_container/{image}.tsv"
        wildcard_constraints:
            image="|".join(CONTAINERS["images"]) or "NONE",
        # Login node where the site allows builds there (config/clusters: container_build).
        localrule: not CLUSTER.container_build.on_compute_node
        conda:
            "../../envs/workflow.yaml"
        threads: 8
        resources:
            mem_mb=32000,
            runtime=120,
        params:
            method=CLUSTER.container_build.method,
            runtime=CLUSTER.container_runtime,
            fakeroot=CLUSTER.container_build.fakeroot,
            base_image=CLUSTER.container_build.base_image,
            build_args=CONTAINERS["build_args"],
            cpu_arch=CLUSTER.cpu_arch if CLUSTER.uses_slurm else None,
            scratch=CLUSTER.scratch,
        script:
            "../scripts/build_container.py"
