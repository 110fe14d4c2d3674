from hpcllm.cli import main

raise SystemExit(main())
