fn main() -> std::process::ExitCode {
    // Before any thread: the umask is the process's (primitives::umask).
    kiln::primitives::umask::settle();
    kiln::cli::main()
}
