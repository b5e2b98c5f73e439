from demo.main import main

raise SystemExit(main())
