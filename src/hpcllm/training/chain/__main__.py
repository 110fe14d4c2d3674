import sys

from hpcllm.training.campaign.chain import main

sys.exit(main())
