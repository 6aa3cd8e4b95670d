from forge_pack.cli import main

main()
