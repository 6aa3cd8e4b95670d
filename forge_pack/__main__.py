from forge_pack.cli.main import main

main()
