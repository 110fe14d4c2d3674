# Placeholder: the vision stage is added by its own issue.


def vision_targets():
    return []
