# The evaluation stage's globals and input/params functions (its rules: evaluate.smk,
# which includes this file first). An experiment is evaluated when it has an `evaluate`
# key: its last checkpoint, as the export stage wrote it for Hugging Face.
from hpcllm.training.plan.experiment import total_iterations as _total_iterations

# Experiments with an `evaluate` key, and the iteration of their last checkpoint.
EVALUATED = {
    name: _total_iterations(prepared.experiment)
    for name, prepared in EXPERIMENTS.items()
    if prepared.experiment.get("evaluate") is not None
}
# The shipped tasks of this workflow, or a project's own resources/eval_tasks/.
EVAL_TASKS_DIR = (
    "resources/eval_tasks"
    if os.path.isdir("resources/eval_tasks")
    else os.path.join(HPCLLM_ROOT, "resources", "eval_tasks")
)

# The `datasets` cache of the tasks (not the home folder, small on clusters).
EVAL_CACHE_DIR = "data/eval_cache"


# A task name that is neither the project's nor lm-eval's stops the plan on every site
# (the staging job found it only after training). Only in the main process: it scans
# lm-eval's task files (under a second, and only for names not shipped here).
if workflow.is_main_process:
    from hpcllm.evaluation.tasks import unknown_tasks as _unknown_eval_tasks

    _problems = [
        p
        for _name in EVALUATED
        for p in _unknown_eval_tasks(
            _name, EXPERIMENTS[_name].experiment["evaluate"]["tasks"], EVAL_TASKS_DIR
        )
    ]
    if _problems:
        raise _WorkflowError("\n".join(_problems))


# Where the login nodes have no internet, task data not staged stop the plan here,
# naming where to stage them (elsewhere the login-node rule downloads them). Only in the
# main process: finding lm-eval's tasks scans its task files (seconds).
if workflow.is_main_process and not CLUSTER.internet.login:
    from hpcllm.evaluation.tasks import plan_problems as _eval_plan_problems

    _problems = [
        p
        for _name in EVALUATED
        for p in _eval_plan_problems(
            _name,
            EXPERIMENTS[_name].experiment["evaluate"]["tasks"],
            EVAL_TASKS_DIR,
            os.environ.get("HPCLLM_HF_MIRROR"),
            CLUSTER.description,
            CLUSTER.path,
        )
    ]
    if _problems:
        raise _WorkflowError("\n".join(_problems))


def evaluated_names():
    """The experiments the default target trains (page_experiment_names) that have an
    `evaluate` key."""
    return [n for n in page_experiment_names() if n in EVALUATED]


def evaluation_targets():
    return [f"results/eval/{name}/scores.csv" for name in evaluated_names()]


def eval_settings(wildcards):
    return EXPERIMENTS[wildcards.experiment].experiment["evaluate"]


def eval_dir(wildcards):
    it = EVALUATED[wildcards.experiment]
    return f"results/eval/{wildcards.experiment}/iter_{it:07d}"


def eval_export_record(wildcards):
    """The export of the experiment's last checkpoint (the export stage's export.json)."""
    it = (
        getattr(wildcards, "iteration", None)
        or f"{EVALUATED[wildcards.experiment]:07d}"
    )
    return f"results/export/{wildcards.experiment}/iter_{it}/export.json"


def eval_table_inputs(wildcards):
    """The evaluations the table gathers: no tasks job where evaluate.tasks is empty
    (perplexity only; lm-eval refuses an empty task list)."""
    folder = eval_dir(wildcards)
    inputs = {
        "perplexity": f"{folder}/perplexity.json",
        "export": eval_export_record(wildcards),
    }
    if eval_settings(wildcards)["tasks"]:
        inputs["tasks"] = f"{folder}/tasks.json"
        inputs["manifest"] = f"data/eval_tasks/{wildcards.experiment}.json"
    return inputs


def eval_source_prefixes(wildcards):
    """Each training source's dataset prefix (the held-out perplexity per source)."""
    exp = EXPERIMENTS[wildcards.experiment].experiment
    tok = exp["data"]["tokenizer"]
    return {
        s: f"data/tokenized/{tok}/{s}_text_document" for s in exp["data"]["sources"]
    }


def eval_split(wildcards):
    return EXPERIMENTS[wildcards.experiment].experiment["data"]["split"]


def eval_gres(wildcards):
    return "gpu:1" if CLUSTER.gpus_per_node else ""


def eval_container(wildcards):
    """The training image where the cluster runs GPU steps in containers (lm-eval and
    transformers are in it), none elsewhere."""
    return container_image("train")
