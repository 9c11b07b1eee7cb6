"""For `kopf run --standalone -m tianji_operator.run [--all-namespaces | -n NS]`: registers the
handlers into Kopf's default registry with settings from the environment. The operator's own
metrics server is not started this way; `python -m tianji_operator` starts both."""

import kopf

from .config import OperatorConfig
from .handlers import register

OPERATOR = register(kopf.get_default_registry(), OperatorConfig.from_env())
